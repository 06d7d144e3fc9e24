//! Twin of compile_fail/name_sealed_trait.rs: the public trait `PinnedSource` is named instead of the seal.
use cuda_pinned::PinnedSource as PinnedMemory;
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn accepts<S: PinnedMemory<f32>>(_: &S) {}

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
