//! Claim: a slice from `Registered::as_slice` cannot be held across a download into the same buffer (E0502).
use cuda_pinned::{Context, DeviceBuffer, Registered, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Registered::new(&context, vec![0.0_f32; 4])?;
    let seen = host.as_slice()?;
    stream.download(&device, &mut host)?;
    println!("{}", seen[0]);
    Ok(())
}

fn main() {
    let _ = run;
}
