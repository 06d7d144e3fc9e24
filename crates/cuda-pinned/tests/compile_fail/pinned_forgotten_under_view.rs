//! Claim: a `Pinned` buffer cannot be moved into `std::mem::forget` while a view of it is still used (E0505).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut view = host.slice_mut(..)?;
    std::mem::forget(host);
    stream.download(&device, &mut view)?;
    Ok(())
}

fn main() {
    let _ = run;
}
