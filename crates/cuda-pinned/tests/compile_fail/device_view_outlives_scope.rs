//! Claim: a view of a `DeviceBuffer` cannot outlive the buffer's scope (E0597).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let view = {
        let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
        device.slice(..)?
    };
    stream.download(&view, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
