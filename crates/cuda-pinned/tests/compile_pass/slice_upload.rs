//! Twin of compile_fail/slice_upload.rs: the same slice goes through the blocking pageable upload.
use cuda_pinned::{Context, DeviceBuffer, Stream};

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let mut device = DeviceBuffer::<f32>::uninit(&stream, 4)?;
    let data = [1.0_f32; 4];
    let host: &[f32] = &data;
    stream.upload_pageable(&host, &mut device)?;
    Ok(())
}

fn main() {
    let _ = run;
}
