//! Twin of compile_fail/declared_use_outlives_buffer.rs: the buffer lives as long as its declared use.
use cuda_pinned::{Context, DeviceBuffer, Stream, Use};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let y = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let used = Use::read(&y);
    // SAFETY: a type-checked program, never run.
    unsafe { stream.enqueue_foreign(&[used], |_| ()) }
}

fn main() {
    let _ = run;
}
