//! Twin of compile_fail/vec_upload.rs: the same `Vec`, registered (page-locked in place), can be uploaded.
use cuda_pinned::{Context, DeviceBuffer, Registered, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = Registered::new(&context, vec![1.0_f32; 4])?;
    stream.upload(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
