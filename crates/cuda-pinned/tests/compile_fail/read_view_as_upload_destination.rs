//! Claim: a read-only view of a `DeviceBuffer` (`slice`) cannot be the destination of an upload (`DeviceView` is not `DeviceDestination`).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let mut view = device.slice(..4)?;
    stream.upload(&host, &mut view)?;
    Ok(())
}

fn main() {
    let _ = run;
}
