//! Twin of compile_fail/device_view_outlives_scope.rs: the buffer is declared in the outer scope, so it outlives the view.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let view = { device.slice(..)? };
    stream.download(&view, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
