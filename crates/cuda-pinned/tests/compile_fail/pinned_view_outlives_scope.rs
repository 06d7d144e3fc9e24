//! Claim: a view of a `Pinned` buffer cannot outlive the buffer's scope (E0597).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut view = {
        let mut host = Pinned::<f32>::zeroed(&context, 4)?;
        host.slice_mut(..)?
    };
    stream.download(&device, &mut view)?;
    Ok(())
}

fn main() {
    let _ = run;
}
