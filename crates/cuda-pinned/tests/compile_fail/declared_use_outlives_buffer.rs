//! Claim: a declared use cannot outlive its buffer (E0597), so work is never declared on freed memory.
use cuda_pinned::{Context, DeviceBuffer, Stream, Use};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let used;
    {
        let y = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
        used = Use::read(&y);
    }
    // SAFETY: a type-checked program, never run.
    unsafe { stream.enqueue_foreign(&[used], |_| ()) }
}

fn main() {
    let _ = run;
}
