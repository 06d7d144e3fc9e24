//! The crate's tests on the simulated driver, through the testkit's API: no GPU, no CUDA toolkit.

use cuda_pinned_sim::{Exclusive, Settings, install_with};

/// Every test installs the simulator first (the first one to run does the work), with the same settings, and
/// holds it for itself: faults, violations and what is alive are the whole process's.
fn simulator() -> Exclusive<'static> {
    match install_with(Settings::new().seed(42).devices(1)) {
        Ok(control) => control.exclusive(),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_round_trip_across_two_streams_keeps_every_value() {
    let sim = simulator();
    let values: Vec<u32> = (0..100_000).map(|i| i * 7 + 1).collect();
    let back = downstream::round_trip(&values).expect("a round trip on the simulator");
    assert_eq!(back, values);
    assert!(
        sim.new_violations().is_empty(),
        "{:?}",
        sim.new_violations()
    );
}

#[test]
fn a_failing_driver_call_is_an_error_of_the_crate_not_a_panic() {
    let sim = simulator();
    // The next device allocation fails as a full device would.
    sim.fail("cuMemAlloc_v2:1:CUDA_ERROR_OUT_OF_MEMORY")
        .and_then(|()| sim.fail("cuMemAllocAsync:1:CUDA_ERROR_OUT_OF_MEMORY"))
        .expect("a valid fault list");
    let error = downstream::round_trip(&[1, 2, 3]).expect_err("the allocation was made to fail");
    assert!(
        error.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{error}"
    );
    assert!(
        sim.new_violations().is_empty(),
        "{:?}",
        sim.new_violations()
    );
}

#[test]
fn nothing_is_left_allocated_once_the_work_is_done() {
    let sim = simulator();
    downstream::round_trip(&[5; 1000]).expect("a round trip on the simulator");
    cuda_pinned::Context::on(0)
        .and_then(|context| context.synchronize())
        .expect("the context's work finishes");
    let live = sim.live();
    assert_eq!(live.device_allocations, 0, "{live:?}");
}
