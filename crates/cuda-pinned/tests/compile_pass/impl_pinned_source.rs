//! Twin of compile_fail/impl_pinned_source.rs: without the impl, naming `PinnedSource` as a bound is legal.
use cuda_pinned::{Context, DeviceBuffer, Pinned, PinnedSource, Stream};

struct Mine(Vec<f32>);

fn upload_from(
    stream: &Stream,
    src: &impl PinnedSource<f32>,
    dst: &mut DeviceBuffer<f32>,
) -> cuda_pinned::Result<()> {
    stream.upload(src, dst)
}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let host = Pinned::<f32>::zeroed(&context, 4)?;
    upload_from(&stream, &host, &mut device)?;
    let mine = Mine(vec![1.0; 4]);
    stream.upload_pageable(&mine.0, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
