//! Claim: pinned memory declared written by device work cannot be read on the host while the declaration lives
//! (E0502): the host reads it after, through an accessor that waits for that work.
use cuda_pinned::{Context, Pinned, Stream, Use};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut host = Pinned::<u32>::zeroed(&context, 8)?;
    let written = Use::write_host(&mut host);
    let seen = host.as_slice()?[0];
    // SAFETY: a type-checked program, never run.
    unsafe { stream.enqueue_foreign(&[written], |_| seen) }?;
    Ok(())
}

fn main() {
    let _ = run;
}
