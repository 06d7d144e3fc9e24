//! Claim: a read view (`slice`) and a mutable view (`slice_mut`) of one `DeviceBuffer` cannot be alive at once, so a device copy cannot read and write one buffer (E0502).
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let other = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let from = device.slice(..4)?;
    let mut to = device.slice_mut(4..)?;
    stream.copy(&from, &mut to)?;
    drop(other);
    Ok(())
}

fn main() {
    let _ = run;
}
