// tests/round_trip.rs: runs in plain `cargo test`, no GPU, no CUDA toolkit.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

#[test]
fn a_round_trip_keeps_every_element() -> Result<(), Box<dyn std::error::Error>> {
    // Load the simulator before the first CUDA call; hold it for this test alone: its faults
    // and violations are the whole process's, and the harness runs tests on several threads.
    let sim = cuda_pinned_sim::install()?.exclusive();
    let context = Context::on(0)?;
    let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
    let mut host = Pinned::from_slice(&context, &[1u32, 2, 3])?;
    let mut device = DeviceBuffer::<u32>::uninit(&a, 3)?;
    a.upload(&host, &mut device)?;
    b.download(&device, &mut host)?; // b waits for a's upload, as on a GPU
    assert_eq!(host.as_slice()?, [1, 2, 3]);
    let violations = sim.new_violations(); // none: nothing used freed memory or waited needlessly
    assert!(violations.is_empty(), "{violations:?}");
    Ok(())
}

#[test]
fn a_full_device_is_an_error_not_a_panic() -> Result<(), Box<dyn std::error::Error>> {
    let sim = cuda_pinned_sim::install()?.exclusive();
    let stream = Stream::new(&Context::on(0)?)?;
    sim.fail("cuMemAllocFromPoolAsync:1:CUDA_ERROR_OUT_OF_MEMORY")?; // the next device allocation
    let Err(error) = DeviceBuffer::<u32>::uninit(&stream, 1024) else {
        panic!("the allocation was made to fail");
    };
    let message = error.to_string(); // what failed, in CUDA's words, and what the crate was doing
    assert!(message.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{message}");
    Ok(())
}
