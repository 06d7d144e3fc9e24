//! Twin of compile_fail/buffer_dropped_under_view.rs: the buffer is dropped after the view's last use.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let view = device.slice(..)?;
    stream.download(&view, &mut host)?;
    drop(device);
    Ok(())
}

fn main() {
    let _ = run;
}
