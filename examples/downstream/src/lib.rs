//! A user's crate built on `cuda-pinned`, with kernels of its own (`cuda/pipeline.cu`, compiled by its
//! build.rs): a small pipeline over two streams that uploads a batch, transforms it with its own kernel, sums
//! it in blocks with a kernel launched the way another library would launch it (through the stream's raw
//! handle, declared to the tracking), and downloads both results. `cuda-pinned` orders every step across the
//! streams on the device; the only `unsafe` is the launch contracts.
//!
//! It also loads a checkpoint PyTorch wrote onto the device and checks it against the file ([`checkpoint`]).
//!
//! Its tests run on the simulated driver in plain `cargo test`, with Rust stand-ins of the kernels; with
//! feature `gpu` (and a CUDA toolkit) the same pipeline runs on a GPU.

pub mod checkpoint;

use cuda_pinned::sys::CUstream;
use cuda_pinned::{Arg, Context, DeviceBuffer, Kernel, LaunchConfig, Module, Pinned, Stream, Use};

/// Threads per block of both kernels, and the elements each block sum covers.
pub const BLOCK: usize = 256;

/// The kernels' PTX, which build.rs compiled from `cuda/pipeline.cu`.
#[cfg(feature = "gpu")]
pub const KERNELS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pipeline.ptx"));
/// Without feature `gpu` there is no compiled image: the simulated driver runs the stand-ins the tests
/// register under the kernels' names, whatever the image.
#[cfg(not(feature = "gpu"))]
pub const KERNELS: &[u8] = b"// cuda/pipeline.cu is compiled only with feature `gpu`\n";

/// What [`Pipeline::run`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// `a * x + b` for each input `x` (wrapping).
    pub values: Vec<u32>,
    /// The wrapping sum of each block of [`BLOCK`] values.
    pub sums: Vec<u32>,
}

/// The pipeline's host reference: what [`Pipeline::run`] computes on the device.
#[must_use]
pub fn expected(input: &[u32], a: u32, b: u32) -> Output {
    let values: Vec<u32> = input
        .iter()
        .map(|&x| a.wrapping_mul(x).wrapping_add(b))
        .collect();
    let sums = values
        .chunks(BLOCK)
        .map(|block| block.iter().fold(0u32, |s, &v| s.wrapping_add(v)))
        .collect();
    Output { values, sums }
}

/// The pipeline's streams and kernels on one device.
pub struct Pipeline {
    context: Context,
    /// Uploads, the block sums and the download of the values.
    io: Stream,
    /// The transform and the download of the sums.
    compute: Stream,
    scale_shift: Kernel,
    block_sums: Kernel,
}

impl Pipeline {
    /// Loads the kernels onto device `ordinal` and makes the streams.
    ///
    /// # Errors
    /// The crate's: no device, an image the device cannot run, a kernel missing from it.
    pub fn new(ordinal: usize) -> cuda_pinned::Result<Pipeline> {
        let context = Context::on(ordinal)?;
        let module = Module::load(&context, KERNELS)?;
        Ok(Pipeline {
            io: Stream::new(&context)?,
            compute: Stream::new(&context)?,
            scale_shift: module.kernel("scale_shift")?,
            block_sums: module.kernel("block_sums")?,
            context,
        })
    }

    /// `a * x + b` for every `x` of `input`, and the sums of its blocks of [`BLOCK`] values, computed on the
    /// device: upload (io stream), transform (compute stream), block sums (io stream, launched as other code
    /// would), downloads (one on each stream). Returns once both results are on the host.
    ///
    /// # Errors
    /// An invalid-argument error for an input of `u32::MAX` elements or more; the crate's.
    pub fn run(&self, input: &[u32], a: u32, b: u32) -> cuda_pinned::Result<Output> {
        let n = u32::try_from(input.len())
            .map_err(|_| cuda_pinned::Error::invalid("Pipeline::run: more than u32::MAX values"))?;
        if input.is_empty() {
            return Ok(expected(input, a, b));
        }
        let blocks = input.len().div_ceil(BLOCK);
        let grid = LaunchConfig::for_elements(input.len(), BLOCK as u32)?;
        let host = Pinned::from_slice(&self.context, input)?;
        let mut x = DeviceBuffer::<u32>::uninit(&self.io, input.len())?;
        let mut y = DeviceBuffer::<u32>::uninit(&self.compute, input.len())?;
        let mut sums = DeviceBuffer::<u32>::uninit(&self.io, blocks)?;
        self.io.upload(&host, &mut x)?;
        // SAFETY: scale_shift(const unsigned* x, unsigned* y, unsigned a, unsigned b, unsigned n) reads
        // x[..n] and writes y[..n].
        unsafe {
            self.compute.launch(
                &self.scale_shift,
                grid,
                &[
                    Arg::read(&x),
                    Arg::write(&mut y),
                    Arg::value(&a),
                    Arg::value(&b),
                    Arg::value(&n),
                ],
            )?;
        }
        let (y_ptr, sums_ptr) = (y.as_raw(), sums.as_raw());
        // SAFETY: the closure launches block_sums(const unsigned* y, unsigned* sums, unsigned n) on the stream
        // it is given; it reads y[..n] and writes sums[..blocks], as declared.
        unsafe {
            self.io
                .enqueue_foreign(&[Use::read(&y), Use::write(&mut sums)], |stream| {
                    launch_block_sums(&self.block_sums, grid, stream, y_ptr, sums_ptr, n)
                })??;
        }
        let mut values = Pinned::<u32>::zeroed(&self.context, input.len())?;
        let mut block_sums = Pinned::<u32>::zeroed(&self.context, blocks)?;
        self.io.download(&y, &mut values)?;
        self.compute.download(&sums, &mut block_sums)?;
        Ok(Output {
            values: values.as_slice()?.to_vec(),
            sums: block_sums.as_slice()?.to_vec(),
        })
    }
}

/// Launches `block_sums` through the driver, on a raw stream, as a C library or another crate would.
///
/// # Safety
/// `y` and `sums` must be device memory of the stream's context of at least `n` and `n.div_ceil(256)`
/// elements, ordered for the launch.
unsafe fn launch_block_sums(
    kernel: &Kernel,
    grid: LaunchConfig,
    stream: CUstream,
    y: u64,
    sums: u64,
    n: u32,
) -> cuda_pinned::Result<()> {
    let (mut y, mut sums, mut n) = (y, sums, n);
    let mut params = [
        (&raw mut y).cast(),
        (&raw mut sums).cast(),
        (&raw mut n).cast(),
    ];
    // SAFETY: three parameters of block_sums' types, read during the call; the memory as the caller
    // guarantees.
    unsafe {
        cuda_pinned::driver_call!(cuLaunchKernel(
            kernel.as_raw(),
            grid.grid[0],
            1,
            1,
            BLOCK as u32,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        ))
    }
}
