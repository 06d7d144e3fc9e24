//! [`Batch`]: what a prefetched batch is made of, on the host and on the device, and how it moves.

use bytemuck::Pod;

use crate::copy::DeviceSource;
use crate::driver::Context;
use crate::driver::Stream;
use crate::error::Result;
use crate::memory::{DeviceBuffer, Pinned, PinnedPool, Track};

/// A batch that a [`Prefetcher`](super::Prefetcher) builds in pinned memory and uploads: the Rust form of a
/// custom type's `pin_memory()` in PyTorch. It knows its pinned parts (the type itself) and their device
/// counterparts ([`Batch::Device`]).
///
/// Implemented for [`Pinned<T>`] (its device side a [`DeviceBuffer<T>`]), for tuples of 2 to 4 batches and for
/// arrays `[B; N]`. A struct of several buffers implements it in a few lines:
///
/// ```
/// use cuda_pinned::prefetch::{Batch, DeviceParts};
/// use cuda_pinned::{DeviceBuffer, Pinned, PinnedPool, Result, Stream};
///
/// /// Images and their labels, in pinned memory.
/// struct Images {
///     pixels: Pinned<f32>,
///     labels: Pinned<u32>,
/// }
///
/// /// The same on the device.
/// struct DeviceImages {
///     pixels: DeviceBuffer<f32>,
///     labels: DeviceBuffer<u32>,
/// }
///
/// /// The shape of a batch: how many images, of how many pixels.
/// struct Shape {
///     images: usize,
///     pixels: usize,
/// }
///
/// impl Batch for Images {
///     type Layout = Shape;
///     type Device = DeviceImages;
///
///     fn alloc_host(pool: &PinnedPool, shape: &Shape) -> Result<Images> {
///         Ok(Images {
///             pixels: pool.alloc(shape.images * shape.pixels)?,
///             labels: pool.alloc(shape.images)?,
///         })
///     }
///
///     fn alloc_device(stream: &Stream, shape: &Shape) -> Result<DeviceImages> {
///         Ok(DeviceImages {
///             pixels: DeviceBuffer::uninit(stream, shape.images * shape.pixels)?,
///             labels: DeviceBuffer::uninit(stream, shape.images)?,
///         })
///     }
///
///     fn upload(&self, stream: &Stream, device: &mut DeviceImages) -> Result<()> {
///         stream.upload(&self.pixels, &mut device.pixels)?;
///         stream.upload(&self.labels, &mut device.labels)
///     }
///
///     fn device_parts<'a>(device: &'a DeviceImages, parts: &mut DeviceParts<'a>) {
///         parts.add(&device.pixels).add(&device.labels);
///     }
/// }
/// ```
///
/// The prefetcher calls these methods; a user of a batch type never needs to.
pub trait Batch: Send + Sized + 'static {
    /// What the allocations need to know: a length for [`Pinned`], a shape for a struct.
    type Layout;
    /// The batch on the device, which the consumer receives.
    type Device: Send + 'static;

    /// Allocates the host side from `pool`, with [`PinnedPool::alloc`]. Its contents are unspecified: the fill
    /// closure writes them.
    ///
    /// The prefetcher's builder holds the batches it allocated before this one, so the `pool` it passes here
    /// never waits for buffers held: when its budget leaves no room, `alloc` fails at once, after waiting only
    /// for device work on blocks given back where the pool waits when full ([`WhenFull`](crate::WhenFull)).
    ///
    /// # Errors
    /// The pool's, such as [`Error::PoolExhausted`](crate::Error::PoolExhausted).
    fn alloc_host(pool: &PinnedPool, layout: &Self::Layout) -> Result<Self>;

    /// Allocates the device side, ordered on `stream` (the prefetcher's copy stream).
    ///
    /// # Errors
    /// The driver's, such as `CUDA_ERROR_OUT_OF_MEMORY`.
    fn alloc_device(stream: &Stream, layout: &Self::Layout) -> Result<Self::Device>;

    /// Enqueues the upload of every part into `device` on `stream`, with [`Stream::upload`] (whose tracking
    /// orders it after the consumer's use of the previous batch in the same memory). Returns at once.
    ///
    /// # Errors
    /// As [`Stream::upload`].
    fn upload(&self, stream: &Stream, device: &mut Self::Device) -> Result<()>;

    /// Lists every device buffer of `device` in `parts`. On delivery the prefetcher declares each used by the
    /// consumer's stream: the stream waits on the device for its upload, and the next upload into it waits
    /// for the work the consumer enqueued on that stream before giving the batch back.
    ///
    /// A part left out is still safe for every use through this crate, whose tracking orders it anyway; only
    /// work enqueued through raw pointers ([`DeviceBuffer::as_raw`]) would go unordered.
    fn device_parts<'a>(device: &'a Self::Device, parts: &mut DeviceParts<'a>);
}

/// The device buffers of a batch, as [`Batch::device_parts`] lists them.
pub struct DeviceParts<'a> {
    pub(super) parts: Vec<(&'a Track, &'a Context)>,
}

impl<'a> DeviceParts<'a> {
    pub(super) fn new() -> DeviceParts<'a> {
        DeviceParts { parts: Vec::new() }
    }

    /// Adds a device buffer (or view) of the batch. Returns `self`, so that calls chain.
    pub fn add<T>(&mut self, part: &'a impl DeviceSource<T>) -> &mut DeviceParts<'a> {
        self.parts.push((part.track(), part.owner()));
        self
    }
}

impl std::fmt::Debug for DeviceParts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceParts")
            .field("parts", &self.parts.len())
            .finish()
    }
}

/// One pinned buffer of `layout` elements, uploaded into a [`DeviceBuffer`] of the same length.
impl<T: Pod + Send + Sync> Batch for Pinned<T> {
    type Layout = usize;
    type Device = DeviceBuffer<T>;

    fn alloc_host(pool: &PinnedPool, len: &usize) -> Result<Pinned<T>> {
        pool.alloc(*len)
    }

    fn alloc_device(stream: &Stream, len: &usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::uninit(stream, *len)
    }

    fn upload(&self, stream: &Stream, device: &mut DeviceBuffer<T>) -> Result<()> {
        stream.upload(self, device)
    }

    fn device_parts<'a>(device: &'a DeviceBuffer<T>, parts: &mut DeviceParts<'a>) {
        parts.add(device);
    }
}

macro_rules! tuple_batch {
    ($($part:ident $i:tt),+) => {
        /// Several batches as one, such as inputs and targets: each part with its own layout.
        impl<$($part: Batch),+> Batch for ($($part,)+) {
            type Layout = ($($part::Layout,)+);
            type Device = ($($part::Device,)+);

            fn alloc_host(pool: &PinnedPool, layout: &Self::Layout) -> Result<Self> {
                Ok(($($part::alloc_host(pool, &layout.$i)?,)+))
            }

            fn alloc_device(stream: &Stream, layout: &Self::Layout) -> Result<Self::Device> {
                Ok(($($part::alloc_device(stream, &layout.$i)?,)+))
            }

            fn upload(&self, stream: &Stream, device: &mut Self::Device) -> Result<()> {
                $(self.$i.upload(stream, &mut device.$i)?;)+
                Ok(())
            }

            fn device_parts<'a>(device: &'a Self::Device, parts: &mut DeviceParts<'a>) {
                $($part::device_parts(&device.$i, parts);)+
            }
        }
    };
}

tuple_batch!(A 0, B 1);
tuple_batch!(A 0, B 1, C 2);
tuple_batch!(A 0, B 1, C 2, D 3);

/// `N` batches of one type as one, each with its own layout.
impl<B: Batch, const N: usize> Batch for [B; N] {
    type Layout = [B::Layout; N];
    type Device = [B::Device; N];

    fn alloc_host(pool: &PinnedPool, layout: &Self::Layout) -> Result<[B; N]> {
        let parts = layout
            .iter()
            .map(|layout| B::alloc_host(pool, layout))
            .collect::<Result<Vec<B>>>()?;
        Ok(into_array(parts))
    }

    fn alloc_device(stream: &Stream, layout: &Self::Layout) -> Result<Self::Device> {
        let parts = layout
            .iter()
            .map(|layout| B::alloc_device(stream, layout))
            .collect::<Result<Vec<B::Device>>>()?;
        Ok(into_array(parts))
    }

    fn upload(&self, stream: &Stream, device: &mut Self::Device) -> Result<()> {
        self.iter()
            .zip(device.iter_mut())
            .try_for_each(|(host, device)| host.upload(stream, device))
    }

    fn device_parts<'a>(device: &'a Self::Device, parts: &mut DeviceParts<'a>) {
        for part in device {
            B::device_parts(part, parts);
        }
    }
}

/// The `N` elements of `parts` as an array; `parts` was made from an array of `N`.
fn into_array<T, const N: usize>(parts: Vec<T>) -> [T; N] {
    match parts.try_into() {
        Ok(array) => array,
        Err(_) => unreachable!("prefetch: {N} parts made from an array of {N}"),
    }
}
