//! Claim: a `DeviceBuffer` cannot be swapped (`std::mem::swap`) while a view of it is still used (E0502).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut other = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let view = device.slice(..)?;
    std::mem::swap(&mut device, &mut other);
    stream.download(&view, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
