//! Twin of compile_fail/two_mut_device_views.rs: the first mutable view is last used before the second is made.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 8)?;
    let mut low = device.slice_mut(..4)?;
    stream.upload(&host, &mut low)?;
    let mut high = device.slice_mut(4..)?;
    stream.upload(&host, &mut high)?;
    Ok(())
}

fn main() {
    let _ = run;
}
