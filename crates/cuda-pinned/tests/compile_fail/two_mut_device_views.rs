//! Claim: two mutable views (`slice_mut`) of one `DeviceBuffer` cannot be alive at once (E0499).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 8)?;
    let mut low = device.slice_mut(..4)?;
    let mut high = device.slice_mut(4..)?;
    stream.upload(&host, &mut low)?;
    stream.upload(&host, &mut high)?;
    Ok(())
}

fn main() {
    let _ = run;
}
