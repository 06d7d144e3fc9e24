//! Twin of compile_fail/launch_reads_and_writes_one_buffer.rs: the buffer read and the one written differ.
use cuda_pinned::{Arg, Context, DeviceBuffer, Kernel, LaunchConfig, Stream};

fn run(kernel: &Kernel) -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let x = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let mut y = DeviceBuffer::<f32>::zeroed(&stream, 8)?;
    let args = [Arg::read(&x), Arg::write(&mut y)];
    // SAFETY: a type-checked program, never run.
    unsafe { stream.launch(kernel, LaunchConfig::new(1, 8), &args) }
}

fn main() {
    let _ = run;
}
