//! Claim: even a slice of pinned memory (`Pinned::as_slice`) cannot be the source of an asynchronous upload: it is untracked.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    stream.upload(&host.as_slice()?, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
