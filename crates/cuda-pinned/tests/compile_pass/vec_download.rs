//! Twin of compile_fail/vec_download.rs: the same `Vec`, registered (page-locked in place), can be downloaded into.
use cuda_pinned::{Context, DeviceBuffer, Registered, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Registered::new(&context, vec![0.0_f32; 4])?;
    stream.download(&device, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
