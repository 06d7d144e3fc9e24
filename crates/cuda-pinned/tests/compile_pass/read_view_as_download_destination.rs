//! Twin of compile_fail/read_view_as_download_destination.rs: a mutable view (`slice_mut`) is the destination.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 8)?;
    let mut view = host.slice_mut(..4)?;
    stream.download(&device, &mut view)?;
    Ok(())
}

fn main() {
    let _ = run;
}
