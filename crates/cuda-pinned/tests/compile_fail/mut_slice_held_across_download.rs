//! Claim: a slice from `Pinned::as_mut_slice` cannot be held across a download into the same buffer (E0499).
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let written = host.as_mut_slice()?;
    stream.download(&device, &mut host)?;
    written[0] = 1.0;
    Ok(())
}

fn main() {
    let _ = run;
}
