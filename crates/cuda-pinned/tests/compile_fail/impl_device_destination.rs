//! Claim: a user type cannot implement the sealed `DeviceSource` / `DeviceDestination` (their supertrait is private to the crate).
use cuda_pinned::{Context, DeviceBuffer, DeviceDestination, DeviceSource, Pinned, Stream};

struct Mine(u64);

impl DeviceSource<f32> for Mine {}
impl DeviceDestination<f32> for Mine {}

fn upload_to(
    stream: &Stream,
    src: &Pinned<f32>,
    dst: &mut impl DeviceDestination<f32>,
) -> cuda_pinned::Result<()> {
    stream.upload(src, dst)
}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    upload_to(&stream, &host, &mut device)?;
    let mine = Mine(device.as_raw());
    println!("{}", mine.0);
    Ok(())
}

fn main() {
    let _ = run;
}
