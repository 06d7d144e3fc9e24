//! Claim: one buffer cannot be both a read and a written argument of a launch (E0502): declare it written.
use cuda_pinned::{Arg, Context, DeviceBuffer, Kernel, LaunchConfig, Stream};

fn run(kernel: &Kernel) -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut y = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let args = [Arg::read(&y), Arg::write(&mut y)];
    // SAFETY: a type-checked program, never run.
    unsafe { stream.launch(kernel, LaunchConfig::new(1, 8), &args) }
}

fn main() {
    let _ = run;
}
