//! Twin of compile_fail/read_and_write_views_of_one_buffer.rs: the read view is of another buffer.
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let other = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let from = other.slice(..4)?;
    let mut to = device.slice_mut(4..)?;
    stream.copy(&from, &mut to)?;
    drop(other);
    Ok(())
}

fn main() {
    let _ = run;
}
