//! Twin of compile_fail/pinned_forgotten_under_view.rs: the buffer is forgotten after the view's last use.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut view = host.slice_mut(..)?;
    stream.download(&device, &mut view)?;
    std::mem::forget(host);
    Ok(())
}

fn main() {
    let _ = run;
}
