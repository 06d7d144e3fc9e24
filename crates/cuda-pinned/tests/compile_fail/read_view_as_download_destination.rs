//! Claim: a read-only view of a `Pinned` buffer (`slice`) cannot be the destination of a download (`PinnedView` is not `PinnedDestination`).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 8)?;
    let mut view = host.slice(..4)?;
    stream.download(&device, &mut view)?;
    Ok(())
}

fn main() {
    let _ = run;
}
