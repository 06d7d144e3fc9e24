//! A user's crate built on `cuda-pinned`: a small library that scales a batch of numbers on the GPU's
//! copy engines (upload, device-to-device copy, download) across two streams. Its tests run on the simulated
//! driver in plain `cargo test`; on a machine with a GPU the same functions run on the GPU.

use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

/// Sends `values` to device 0 on one stream, copies them on the device on a second stream, and brings the
/// copy back on the first: the crate orders the three copies across the streams, on the device.
///
/// # Errors
/// Any error of the driver, such as no device.
pub fn round_trip(values: &[u32]) -> cuda_pinned::Result<Vec<u32>> {
    let context = Context::on(0)?;
    let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
    let mut host = Pinned::from_slice(&context, values)?;
    let mut first = DeviceBuffer::<u32>::uninit(&a, values.len())?;
    let mut second = DeviceBuffer::<u32>::uninit(&b, values.len())?;
    a.upload(&host, &mut first)?;
    b.copy(&first, &mut second)?;
    a.download(&second, &mut host)?;
    Ok(host.as_slice()?.to_vec())
}
