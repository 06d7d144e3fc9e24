//! Twin of compile_fail/mut_slice_held_across_upload.rs: the slice is last written before the upload.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let written = host.as_mut_slice()?;
    written[0] = 1.0;
    stream.upload(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
