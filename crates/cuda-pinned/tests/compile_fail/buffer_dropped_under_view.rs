//! Claim: a `DeviceBuffer` cannot be dropped (moved out) while a view of it is still used (E0505).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let view = device.slice(..)?;
    drop(device);
    stream.download(&view, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
