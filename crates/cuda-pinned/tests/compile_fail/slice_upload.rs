//! Claim: a slice (`&[f32]`) cannot be the source of an asynchronous upload (`&[f32]` is not `PinnedSource`).
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let data = [1.0_f32; 4];
    let host: &[f32] = &data;
    stream.upload(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
