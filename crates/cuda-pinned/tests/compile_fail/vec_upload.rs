//! Claim: a `Vec` cannot be the source of an asynchronous upload (`Vec<f32>` is not `PinnedSource`).
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = vec![1.0_f32; 4];
    stream.upload(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
