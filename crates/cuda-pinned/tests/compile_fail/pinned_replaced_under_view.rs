//! Claim: a `Pinned` buffer cannot be replaced (`std::mem::replace`) while a mutable view of it is still used (E0499).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut view = host.slice_mut(..)?;
    let old = std::mem::replace(&mut host, Pinned::zeroed(&context, 4)?);
    stream.download(&device, &mut view)?;
    drop(old);
    Ok(())
}

fn main() {
    let _ = run;
}
