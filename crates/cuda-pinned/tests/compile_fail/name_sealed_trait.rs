//! Claim: the seal, the supertrait `PinnedMemory` of `PinnedSource` in the crate's private module, cannot be named from outside (E0603).
use cuda_pinned::copy::sealed::PinnedMemory;
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn accepts<S: PinnedMemory>(_: &S) {}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    accepts(&host);
    stream.upload(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
