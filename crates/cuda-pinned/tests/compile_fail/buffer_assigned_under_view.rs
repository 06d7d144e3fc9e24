//! Claim: a `DeviceBuffer` cannot be overwritten by assignment while a view of it is still used (E0506).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let view = device.slice(..)?;
    device = DeviceBuffer::zeroed(&stream, 4)?;
    stream.download(&view, &mut host)?;
    drop(device);
    Ok(())
}

fn main() {
    let _ = run;
}
