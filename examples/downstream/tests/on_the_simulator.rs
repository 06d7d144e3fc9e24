//! The crate's tests on the simulated driver, through the testkit's API: no GPU, no CUDA toolkit. The
//! crate's kernels run as Rust stand-ins registered under their names, in stream order, on the simulator's
//! memory.
#![cfg(not(feature = "gpu"))]

use cuda_pinned_sim::{Exclusive, KernelCall, Settings, install_with};
use downstream::checkpoint::load_and_check;
use downstream::{BLOCK, Pipeline, expected};

/// `scale_shift(const unsigned* x, unsigned* y, unsigned a, unsigned b, unsigned n)` as the device runs it.
fn scale_shift(call: &mut KernelCall<'_>) {
    let (x, y) = (call.arg::<u64>(0), call.arg::<u64>(1));
    let (a, b, n) = (call.arg::<u32>(2), call.arg::<u32>(3), call.arg::<u32>(4));
    let threads = call.grid()[0] as usize * call.block()[0] as usize;
    let n = (n as usize).min(threads);
    let out: Vec<u32> = call
        .read::<u32>(x, n)
        .into_iter()
        .map(|v| a.wrapping_mul(v).wrapping_add(b))
        .collect();
    call.write(y, &out);
}

/// `block_sums(const unsigned* y, unsigned* sums, unsigned n)`: one sum per block of the grid.
fn block_sums(call: &mut KernelCall<'_>) {
    let (y, sums, n) = (
        call.arg::<u64>(0),
        call.arg::<u64>(1),
        call.arg::<u32>(2) as usize,
    );
    let blocks = call.grid()[0] as usize;
    let values = call.read::<u32>(y, n.min(blocks * BLOCK));
    let mut out: Vec<u32> = values
        .chunks(BLOCK)
        .map(|block| block.iter().fold(0u32, |s, &v| s.wrapping_add(v)))
        .collect();
    out.resize(blocks, 0);
    call.write(sums, &out);
}

/// Every test installs the simulator first (the first one to run does the work), with the same settings, and
/// holds it for itself: faults, violations and what is alive are the whole process's.
fn simulator() -> Exclusive<'static> {
    let control =
        install_with(Settings::new().seed(42).devices(1)).unwrap_or_else(|e| panic!("{e}"));
    control
        .register_kernel("scale_shift", &[8, 8, 4, 4, 4], scale_shift)
        .and_then(|()| control.register_kernel("block_sums", &[8, 8, 4], block_sums))
        .unwrap_or_else(|e| panic!("{e}"));
    control.exclusive()
}

#[test]
fn the_pipeline_matches_the_host_reference_across_two_streams() {
    let sim = simulator();
    let pipeline = Pipeline::new(0).expect("the pipeline on the simulator");
    for len in [1, 255, 256, 257, 100_000] {
        let input: Vec<u32> = (0..len as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let got = pipeline.run(&input, 3, 11).expect("a run on the simulator");
        assert!(
            got == expected(&input, 3, 11),
            "{len} values: the pipeline differs from the host"
        );
    }
    assert!(pipeline.run(&[], 3, 11).unwrap().values.is_empty());
    assert!(
        sim.new_violations().is_empty(),
        "{:?}",
        sim.new_violations()
    );
}

#[test]
fn a_failing_launch_is_an_error_of_the_crate_not_a_panic() {
    let sim = simulator();
    let pipeline = Pipeline::new(0).expect("the pipeline on the simulator");
    for call in 1..=2 {
        sim.fail(&format!(
            "cuLaunchKernel:{call}:CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
        ))
        .expect("a valid fault list");
        let error = pipeline
            .run(&[1, 2, 3], 1, 0)
            .expect_err("the launch was made to fail");
        assert!(
            error
                .to_string()
                .contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
            "{error}"
        );
        sim.clear_faults();
    }
    assert!(
        sim.new_violations().is_empty(),
        "{:?}",
        sim.new_violations()
    );
}

#[test]
fn a_failing_driver_call_is_an_error_of_the_crate_not_a_panic() {
    let sim = simulator();
    let pipeline = Pipeline::new(0).expect("the pipeline on the simulator");
    // The next device allocation fails as a full device would.
    sim.fail("cuMemAlloc_v2:1:CUDA_ERROR_OUT_OF_MEMORY")
        .and_then(|()| sim.fail("cuMemAllocFromPoolAsync:1:CUDA_ERROR_OUT_OF_MEMORY"))
        .expect("a valid fault list");
    let error = pipeline
        .run(&[1, 2, 3], 1, 0)
        .expect_err("the allocation was made to fail");
    assert!(
        error.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{error}"
    );
    sim.clear_faults();
    assert!(
        sim.new_violations().is_empty(),
        "{:?}",
        sim.new_violations()
    );
}

#[test]
fn nothing_is_left_allocated_once_the_work_is_done() {
    let sim = simulator();
    {
        let pipeline = Pipeline::new(0).expect("the pipeline on the simulator");
        pipeline
            .run(&[5; 1000], 2, 1)
            .expect("a run on the simulator");
    }
    cuda_pinned::Context::on(0)
        .and_then(|context| context.synchronize())
        .expect("the context's work finishes");
    let live = sim.live();
    assert_eq!(live.device_allocations, 0, "{live:?}");
}

/// The checkpoint PyTorch wrote (`tests/data`, made by `scripts/make-checkpoint.py`), whole and sharded, embedded
/// in the test binary and written to a temporary directory where it runs.
fn unpacked(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("downstream-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, bytes) in [
        (
            "tiny.safetensors",
            &include_bytes!("data/tiny.safetensors")[..],
        ),
        (
            "model.safetensors.index.json",
            include_bytes!("data/sharded/model.safetensors.index.json"),
        ),
        (
            "model-00001-of-00002.safetensors",
            include_bytes!("data/sharded/model-00001-of-00002.safetensors"),
        ),
        (
            "model-00002-of-00002.safetensors",
            include_bytes!("data/sharded/model-00002-of-00002.safetensors"),
        ),
    ] {
        std::fs::write(dir.join(file), bytes).unwrap();
    }
    dir
}

#[test]
fn a_checkpoint_pytorch_wrote_loads_byte_for_byte() {
    let _sim = simulator();
    let dir = unpacked("checkpoint");
    let whole = load_and_check(&dir.join("tiny.safetensors"), 0).unwrap_or_else(|e| panic!("{e}"));
    let sharded = load_and_check(&dir.join("model.safetensors.index.json"), 0)
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(whole.tensors >= 8, "{whole:?}");
    assert_eq!(
        (sharded.tensors, sharded.bytes),
        (whole.tensors, whole.bytes)
    );
}
