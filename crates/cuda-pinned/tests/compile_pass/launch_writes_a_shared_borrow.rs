//! Twin of compile_fail/launch_writes_a_shared_borrow.rs: the written buffer is borrowed exclusively.
use cuda_pinned::{Arg, Context, DeviceBuffer, Kernel, LaunchConfig, Stream};

fn run(kernel: &Kernel) -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut y = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    // SAFETY: a type-checked program, never run.
    unsafe { stream.launch(kernel, LaunchConfig::new(1, 8), &[Arg::write(&mut y)]) }
}

fn main() {
    let _ = run;
}
