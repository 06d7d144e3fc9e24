//! Twin of compile_fail/buffer_swapped_under_view.rs: the buffers are swapped after the view's last use.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut other = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let view = device.slice(..)?;
    stream.download(&view, &mut host)?;
    std::mem::swap(&mut device, &mut other);
    Ok(())
}

fn main() {
    let _ = run;
}
