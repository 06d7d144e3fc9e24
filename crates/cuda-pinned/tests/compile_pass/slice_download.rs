//! Twin of compile_fail/slice_download.rs: the same slice goes through the blocking pageable download.
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let device = DeviceBuffer::<f32>::zeroed(&stream, 4)?;
    let mut data = [0.0_f32; 4];
    let mut host: &mut [f32] = &mut data;
    stream.download_pageable(&device, &mut host)?;
    Ok(())
}

fn main() {
    let _ = run;
}
