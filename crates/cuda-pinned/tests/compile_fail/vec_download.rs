//! Claim: a `Vec` cannot be the destination of an asynchronous download (`Vec<f32>` is not `PinnedDestination`).
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = vec![0.0_f32; 4];
    stream.download(&device, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
