//! Claim: a kernel argument the kernel writes needs the buffer borrowed exclusively (`Arg::write` takes `&mut`).
use cuda_pinned::{Arg, Context, DeviceBuffer, Kernel, LaunchConfig, Stream};

fn run(kernel: &Kernel) -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let y = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    // SAFETY: a type-checked program, never run.
    unsafe { stream.launch(kernel, LaunchConfig::new(1, 8), &[Arg::write(&y)]) }
}

fn main() {
    let _ = run;
}
