//! Twin of compile_fail/read_view_as_upload_destination.rs: a mutable view (`slice_mut`) is the destination.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let mut view = device.slice_mut(..4)?;
    stream.upload(&host, &mut view)?;
    Ok(())
}

fn main() {
    let _ = run;
}
