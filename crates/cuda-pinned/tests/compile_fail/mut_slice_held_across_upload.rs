//! Claim: a slice from `Pinned::as_mut_slice` cannot be written while an upload from the same buffer is enqueued after it was taken (E0502).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let written = host.as_mut_slice()?;
    stream.upload(&host, &mut device)?;
    written[0] = 1.0;
    Ok(())
}

fn main() {
    let _ = run;
}
