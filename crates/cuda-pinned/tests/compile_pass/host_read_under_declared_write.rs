//! Twin of compile_fail/host_read_under_declared_write.rs: the host reads after the declared work.
use cuda_pinned::{Context, Pinned, Stream, Use};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<u32>::zeroed(&context, 8)?;
    let written = Use::write_host(&mut host);
    // SAFETY: a type-checked program, never run.
    unsafe { stream.enqueue_foreign(&[written], |_| ()) }?;
    let _seen = host.as_slice()?[0];
    Ok(())
}

fn main() {
    let _ = run;
}
