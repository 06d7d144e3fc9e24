//! Claim: two mutable views (`slice_mut`) of one `Pinned` buffer cannot be alive at once (E0499).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 8)?;
    let mut low = host.slice_mut(..4)?;
    let mut high = host.slice_mut(4..)?;
    stream.download(&device, &mut low)?;
    stream.download(&device, &mut high)?;
    Ok(())
}

fn main() {
    let _ = run;
}
