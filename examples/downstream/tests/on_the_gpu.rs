//! The same pipeline on a GPU (feature `gpu`): the kernels of `cuda/pipeline.cu` against the host reference,
//! run under compute-sanitizer's memcheck, racecheck and synccheck too.
#![cfg(feature = "gpu")]

use downstream::checkpoint::load_and_check;
use downstream::{Pipeline, expected};

#[test]
fn the_pipeline_matches_the_host_reference_on_the_gpu() {
    let pipeline = Pipeline::new(0).expect("a GPU under feature `gpu`");
    for len in [1, 255, 256, 257, 100_000, 1 << 24] {
        let input: Vec<u32> = (0..len as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let got = pipeline.run(&input, 3, 11).expect("a run on the GPU");
        assert!(
            got == expected(&input, 3, 11),
            "{len} values: the pipeline differs from the host"
        );
    }
    assert!(pipeline.run(&[], 3, 11).unwrap().values.is_empty());
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
fn a_checkpoint_pytorch_wrote_loads_byte_for_byte_on_the_gpu() {
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

/// A kernel launched by cudarc on a stream shared with the crate, declared with `enqueue_foreign`: its output
/// is downloaded on another of the crate's streams, which waits for it on the device. The control leaves the
/// write undeclared, behind 300 ms of other work on the stream, and the download reads the buffer too early.
#[cfg(feature = "cudarc")]
mod cudarc_interop {
    use std::sync::Arc;

    use cuda_pinned::{DeviceBuffer, Pinned, Stream, Use};
    use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
    use cudarc::nvrtc::Ptx;
    use downstream::{BLOCK, KERNELS, expected};

    struct Shared {
        theirs: Arc<CudaStream>,
        ours: Stream,
        other: Stream,
        scale_shift: CudaFunction,
        delay: CudaFunction,
    }

    fn shared() -> Shared {
        let cuda = CudaContext::new(0).expect("a GPU");
        let theirs = cuda.new_stream().unwrap();
        // SAFETY: the test never captures the stream into a graph.
        let ours = unsafe { Stream::from_cudarc(&theirs) }.unwrap();
        let other = Stream::new(ours.context()).unwrap();
        let ptx = String::from_utf8(KERNELS.to_vec()).expect("PTX is text");
        let module = cuda.load_module(Ptx::from_src(ptx)).unwrap();
        Shared {
            scale_shift: module.load_function("scale_shift").unwrap(),
            delay: module.load_function("delay").unwrap(),
            theirs,
            ours,
            other,
        }
    }

    /// `scale_shift` by cudarc on the shared stream behind a 300 ms delay, writing `y`, declared or not;
    /// then `y` downloaded on another stream: what it held, and what it should.
    fn run(declared: bool) -> (Vec<u32>, Vec<u32>) {
        let s = shared();
        let input: Vec<u32> = (0..1u32 << 20)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let n = input.len() as u32;
        let slice = s.theirs.clone_htod(&input).unwrap();
        // SAFETY: the test never captures the stream into a graph.
        let x = unsafe { DeviceBuffer::from_cudarc(slice, &s.ours) }.unwrap();
        let mut y = DeviceBuffer::<u32>::zeroed(&s.other, input.len()).unwrap();
        s.other.synchronize().unwrap();
        let (xp, yp, a, b) = (x.as_raw(), y.as_raw(), 3u32, 11u32);
        let launch = |_stream| -> Result<(), cudarc::driver::DriverError> {
            let ns = 300_000_000u64;
            // SAFETY: delay(unsigned long long) touches no memory; scale_shift(const unsigned*, unsigned*,
            // unsigned, unsigned, unsigned) reads x[..n] and writes y[..n], live buffers of this context.
            unsafe {
                s.theirs
                    .launch_builder(&s.delay)
                    .arg(&ns)
                    .launch(LaunchConfig::for_num_elems(1))?;
                s.theirs
                    .launch_builder(&s.scale_shift)
                    .arg(&xp)
                    .arg(&yp)
                    .arg(&a)
                    .arg(&b)
                    .arg(&n)
                    .launch(LaunchConfig {
                        grid_dim: (n.div_ceil(BLOCK as u32), 1, 1),
                        block_dim: (BLOCK as u32, 1, 1),
                        shared_mem_bytes: 0,
                    })?;
            }
            Ok(())
        };
        let uses = if declared {
            vec![Use::read(&x), Use::write(&mut y)]
        } else {
            vec![Use::read(&x)]
        };
        // SAFETY: the kernels run on the stream given (cudarc's, which it is), touching x and y as above (y
        // left undeclared in the control).
        unsafe { s.ours.enqueue_foreign(&uses, launch) }
            .unwrap()
            .unwrap();
        drop(uses);
        let mut host = Pinned::<u32>::zeroed(s.ours.context(), input.len()).unwrap();
        s.other.download(&y, &mut host).unwrap();
        let got = host.as_slice().unwrap().to_vec();
        s.theirs.synchronize().unwrap();
        if declared {
            // Back to cudarc: the same values, read by cudarc.
            let back = y.into_cudarc(&s.theirs).unwrap();
            assert_eq!(s.theirs.clone_dtoh(&back).unwrap(), got);
        }
        (got, expected(&input, a, b).values)
    }

    #[test]
    fn a_cudarc_kernel_declared_on_a_shared_stream_is_waited_for() {
        let (got, want) = run(true);
        assert!(
            got == want,
            "the download did not see cudarc's kernel's output"
        );
    }

    #[test]
    fn control_an_undeclared_cudarc_kernel_is_not_waited_for() {
        let (got, want) = run(false);
        assert!(
            got != want,
            "the undeclared write was waited for: this control cannot show the rule"
        );
    }
}
