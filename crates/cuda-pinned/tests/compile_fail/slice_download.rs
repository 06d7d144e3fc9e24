//! Claim: a slice (`&mut [f32]`) cannot be the destination of an asynchronous download (`&mut [f32]` is not `PinnedDestination`).
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut data = [0.0_f32; 4];
    let mut host: &mut [f32] = &mut data;
    stream.download(&device, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
