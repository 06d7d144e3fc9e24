//! Twin of compile_fail/pinned_replaced_under_view.rs: the buffer is replaced after the view's last use.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let mut view = host.slice_mut(..)?;
    stream.download(&device, &mut view)?;
    let old = std::mem::replace(&mut host, Pinned::zeroed(&context, 4)?);
    drop(old);
    Ok(())
}

fn main() {
    let _ = run;
}
