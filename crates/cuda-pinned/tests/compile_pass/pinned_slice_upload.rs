//! Twin of compile_fail/pinned_slice_upload.rs: the `Pinned` buffer itself is uploaded, not a slice of it.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    stream.upload(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
