//! Twin of compile_fail/slice_held_across_download.rs: the slice is last used before the download.
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut host = Pinned::<f32>::zeroed(&context, 4)?;
    let seen = host.as_slice()?;
    println!("{}", seen[0]);
    stream.download(&device, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
