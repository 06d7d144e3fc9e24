//! Twin of compile_fail/two_mut_pinned_views.rs: the first mutable view is last used before the second is made.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 8)?;
    let mut low = host.slice_mut(..4)?;
    stream.download(&device, &mut low)?;
    let mut high = host.slice_mut(4..)?;
    stream.download(&device, &mut high)?;
    Ok(())
}

fn main() {
    let _ = run;
}
