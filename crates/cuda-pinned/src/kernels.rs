//! The small kernels of `cuda/kernels.cu`: their host references, and (feature `gpu`) their safe launchers.
//!
//! [`checksum`] runs on the CPU and computes, bit for bit, the value that the device `checksum` kernel writes,
//! so a test can check data that reached the device by comparing two `u64`s instead of copying the data back.
//!
//! The launchers take buffers and a stream and take part in the tracking as copies do: each declares what it
//! reads and writes, waits on the device for conflicting work from other streams, and returns at once.

#![allow(unsafe_code)]

/// Multiplier that makes each word's term depend on the word's index (the 64-bit golden ratio,
/// as in `SplitMix64`).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The `SplitMix64` finaliser: a bijection on `u64` in which every input bit affects every
/// output bit. `mix64` in `cuda/kernels.cu` is the same function.
const fn mix64(mut z: u64) -> u64 {
    z ^= z >> 30;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z
}

/// The little-endian `u64` made of `chunk` (at most 8 bytes), missing high bytes taken as 0.
#[inline]
fn le_word(chunk: &[u8]) -> u64 {
    let mut word = [0; 8];
    word[..chunk.len()].copy_from_slice(chunk);
    u64::from_le_bytes(word)
}

/// The 64-bit checksum of `bytes`, as the device launcher `cuda_pinned_checksum` computes it.
///
/// For the same bytes this and the kernel in `cuda/kernels.cu` return the same value, so a
/// test can verify a transfer on the device without copying the data back.
///
/// The definition, with all arithmetic wrapping (mod 2<sup>64</sup>):
///
/// - `mix64` is the `SplitMix64` finaliser;
/// - word `w[k]`, for `k` in `0..len.div_ceil(8)`, is the little-endian `u64` of
///   `bytes[8k..8k + 8]`, bytes past the end taken as 0;
/// - the checksum is `mix64(len) + Σ mix64(w[k] ^ (k * 0x9E37_79B9_7F4A_7C15))`.
///
/// Each word is mixed with its index, so moving data changes the result, and the length is
/// mixed in, so trailing zero bytes do too. It is a fast check against corruption and
/// misplaced data, not a cryptographic hash. The checksum of the empty slice is `0`.
#[must_use]
pub fn checksum(bytes: &[u8]) -> u64 {
    let chunks = bytes.chunks_exact(8);
    let tail = chunks.remainder();
    let mut sum = mix64(bytes.len() as u64);
    let mut key = 0u64; // k * GOLDEN for the current word k, kept up to date by addition.
    for chunk in chunks {
        sum = sum.wrapping_add(mix64(le_word(chunk) ^ key));
        key = key.wrapping_add(GOLDEN);
    }
    if !tail.is_empty() {
        sum = sum.wrapping_add(mix64(le_word(tail) ^ key));
    }
    sum
}

#[cfg(any(feature = "gpu", docsrs))]
#[cfg_attr(docsrs, doc(cfg(feature = "gpu")))]
pub use launch::{axpy, device_checksum, fill, spin};

/// The launchers of `cuda/kernels.cu` as they are exported, for device memory and streams the crate does not
/// own (raw pointers and handles): each enqueues its kernel and returns the launch error as a `cudaError_t`
/// (turn it into a `Result` with [`raw::check_launch`]). Nothing here is tracked: the caller orders the work.
/// They launch through the CUDA runtime, which, called on a thread with no current context, makes the primary
/// context of its device (device 0 unless the thread chose another) current and leaves it so: push the
/// stream's context around the call to leave the thread as it was.
#[cfg(any(feature = "gpu", docsrs))]
#[cfg_attr(docsrs, doc(cfg(feature = "gpu")))]
pub mod raw {
    pub use crate::kernels_ffi::{
        check_launch, cuda_pinned_axpy_f32, cuda_pinned_checksum, cuda_pinned_fill_u8,
        cuda_pinned_fill_u16, cuda_pinned_fill_u32, cuda_pinned_fill_u64, cuda_pinned_spin,
    };
}

#[cfg(any(feature = "gpu", docsrs))]
mod launch {
    use std::time::Duration;

    use bytemuck::Pod;

    use crate::copy::{DeviceDestination, DeviceSource};
    use crate::driver::{Category, Stream};
    use crate::error::{Error, Result};
    use crate::kernels_ffi as raw;
    use crate::memory::Work;

    /// Waits until the kernels are loaded into `stream`'s context (at once, but just after the context was
    /// made); the error of the loading, if it failed.
    fn loaded(stream: &Stream) -> Result<()> {
        raw::loaded(stream.context().device().ordinal())
    }

    /// Sets every element of `dst` to `value`, on `stream`. Returns at once. Elements of 1, 2, 4 or 8 bytes.
    ///
    /// # Errors
    /// An invalid-argument error for other element sizes or a buffer of another context; the launch error.
    pub fn fill<T: Pod>(
        stream: &Stream,
        dst: &mut impl DeviceDestination<T>,
        value: T,
    ) -> Result<()> {
        stream.check_context(dst)?;
        let (ptr, n) = (dst.device_ptr(), dst.elements());
        if n == 0 {
            return Ok(());
        }
        let bytes = bytemuck::bytes_of(&value);
        let s = stream.as_raw();
        loaded(stream)?;
        // The runtime launches into the thread's current context: make it the stream's.
        let _current = stream.context().enter()?;
        let work = Work::Timed(Category::Kernel, "fill", n * bytes.len());
        stream.tracked_as(work, None, Some(dst.track()), || {
            // SAFETY: `ptr` is `n` elements of `size_of::<T>()` bytes of live device memory (aligned to the
            // element size: allocations are 256-byte aligned and views start at whole elements), ordered by
            // the tracker; each launcher writes exactly that range.
            let code = unsafe {
                match *bytes {
                    [b] => raw::cuda_pinned_fill_u8(ptr as *mut u8, b, n, s),
                    [a, b] => {
                        raw::cuda_pinned_fill_u16(ptr as *mut u16, u16::from_ne_bytes([a, b]), n, s)
                    }
                    [a, b, c, d] => raw::cuda_pinned_fill_u32(
                        ptr as *mut u32,
                        u32::from_ne_bytes([a, b, c, d]),
                        n,
                        s,
                    ),
                    [a, b, c, d, e, f, g, h] => raw::cuda_pinned_fill_u64(
                        ptr as *mut u64,
                        u64::from_ne_bytes([a, b, c, d, e, f, g, h]),
                        n,
                        s,
                    ),
                    _ => {
                        return Err(Error::invalid(format_args!(
                            "fill: elements of {} bytes are not supported (1, 2, 4 or 8)",
                            bytes.len()
                        )));
                    }
                }
            };
            raw::check_launch(code, "cuda_pinned_fill")
        })
    }

    /// `y[i] = a * x[i] + y[i]` on `stream` (the multiply-add may be fused). Returns at once.
    ///
    /// # Errors
    /// An invalid-argument error if the lengths differ or a buffer belongs to another context; the launch error.
    pub fn axpy(
        stream: &Stream,
        a: f32,
        x: &impl DeviceSource<f32>,
        y: &mut impl DeviceDestination<f32>,
    ) -> Result<()> {
        stream.check_context(x)?;
        stream.check_context(y)?;
        if x.elements() != y.elements() {
            return Err(Error::invalid(format_args!(
                "axpy: x has {} elements and y {}; nothing was enqueued",
                x.elements(),
                y.elements()
            )));
        }
        let (xp, yp, n) = (x.device_ptr(), y.device_ptr(), y.elements());
        if n == 0 {
            return Ok(());
        }
        loaded(stream)?;
        let _current = stream.context().enter()?;
        let work = Work::Timed(Category::Kernel, "axpy", n * 4);
        stream.tracked_as(work, Some(x.track()), Some(y.track()), || {
            // SAFETY: two ranges of `n` floats of live device memory, ordered by the trackers.
            let code = unsafe {
                raw::cuda_pinned_axpy_f32(a, xp as *const f32, yp as *mut f32, n, stream.as_raw())
            };
            raw::check_launch(code, "cuda_pinned_axpy_f32")
        })
    }

    /// Writes the 64-bit [`checksum`](super::checksum) of the bytes of `data` into `out[0]`, on `stream`.
    /// Returns at once.
    ///
    /// # Errors
    /// An invalid-argument error unless `out` has exactly one element, or for a buffer of another context; the
    /// launch error.
    pub fn device_checksum<T: Pod>(
        stream: &Stream,
        data: &impl DeviceSource<T>,
        out: &mut impl DeviceDestination<u64>,
    ) -> Result<()> {
        stream.check_context(data)?;
        stream.check_context(out)?;
        if out.elements() != 1 {
            return Err(Error::invalid(format_args!(
                "device_checksum: `out` has {} elements, not 1",
                out.elements()
            )));
        }
        let bytes = data.elements() * size_of::<T>();
        let (dp, op) = (data.device_ptr(), out.device_ptr());
        loaded(stream)?;
        let _current = stream.context().enter()?;
        let work = Work::Timed(Category::Kernel, "checksum", bytes);
        stream.tracked_as(work, Some(data.track()), Some(out.track()), || {
            // SAFETY: `bytes` bytes of live device memory read, one u64 written, ordered by the trackers.
            let code = unsafe {
                raw::cuda_pinned_checksum(dp as *const _, bytes, op as *mut u64, stream.as_raw())
            };
            raw::check_launch(code, "cuda_pinned_checksum")
        })
    }

    /// Keeps `stream` busy for at least `duration` of the GPU's clock, touching no memory: for overlap and
    /// race tests. Returns at once.
    ///
    /// # Errors
    /// The launch error.
    pub fn spin(stream: &Stream, duration: Duration) -> Result<()> {
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        loaded(stream)?;
        let _current = stream.context().enter()?;
        // Tracked with no buffers: the crate's marks on this stream are kept before it (driver/marks.rs).
        let work = Work::Timed(Category::Kernel, "spin", 0);
        stream.tracked_as(work, None, None, || {
            // SAFETY: a live stream; the kernel touches no memory.
            raw::check_launch(
                unsafe { raw::cuda_pinned_spin(ns, stream.as_raw()) },
                "cuda_pinned_spin",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{GOLDEN, checksum, mix64};

    /// The definition followed literally, byte by byte, sharing no code with `checksum`.
    fn reference(bytes: &[u8]) -> u64 {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (i, &b) in bytes.iter().enumerate() {
            words[i / 8] |= u64::from(b) << (8 * (i % 8));
        }
        let mut sum = mix64(bytes.len() as u64);
        for (k, w) in words.into_iter().enumerate() {
            sum = sum.wrapping_add(mix64(w ^ (k as u64).wrapping_mul(GOLDEN)));
        }
        sum
    }

    /// Deterministic pseudo-random bytes (xorshift64), so tests need no external crate.
    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect()
    }

    #[test]
    fn empty_is_mix_of_zero_length() {
        assert_eq!(checksum(&[]), mix64(0));
        assert_eq!(checksum(&[]), 0);
    }

    #[test]
    fn matches_bytewise_reference() {
        let data = pseudo_random(1100, 0x1234_5678_9ABC_DEF1);
        for len in (0..=40).chain([63, 64, 65, 999, 1000, 1001]) {
            for offset in [0, 1, 3, 7] {
                let bytes = &data[offset..offset + len];
                assert_eq!(
                    checksum(bytes),
                    reference(bytes),
                    "len {len}, offset {offset}"
                );
            }
        }
    }

    #[test]
    fn known_values() {
        // Computed by an independent C implementation of the definition, so a change to it
        // on one side alone is caught.
        assert_eq!(checksum(&[0]), 0x5692_161D_100B_05E5);
        assert_eq!(checksum(&[1]), 0xAD24_2C3A_2016_0BCA);
        assert_eq!(checksum(b"abcdefgh"), 0xB0F1_B20F_34C2_2998);
        assert_eq!(checksum(b"abcdefghi"), 0x77DA_4EA1_0754_CB37);
        let counting: Vec<u8> = (0..=255).collect();
        assert_eq!(checksum(&counting), 0xEDA3_4615_DEBD_18E3);
    }

    #[test]
    fn swapping_two_words_changes_it() {
        let mut bytes = pseudo_random(64, 7);
        let before = checksum(&bytes);
        let (first, rest) = bytes.split_at_mut(8);
        assert_ne!(first, &rest[16..24]);
        first.swap_with_slice(&mut rest[16..24]);
        assert_ne!(checksum(&bytes), before);
    }

    #[test]
    fn appending_a_zero_byte_changes_it() {
        for len in [0, 1, 7, 8, 9, 100] {
            let mut bytes = pseudo_random(len, 11);
            let before = checksum(&bytes);
            bytes.push(0);
            assert_ne!(checksum(&bytes), before, "len {len}");
        }
    }

    #[test]
    fn flipping_any_single_bit_changes_it() {
        let mut bytes = pseudo_random(1000, 0xDEAD_BEEF);
        let original = checksum(&bytes);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                bytes[i] ^= 1 << bit;
                assert_ne!(checksum(&bytes), original, "byte {i}, bit {bit}");
                bytes[i] ^= 1 << bit;
            }
        }
        assert_eq!(checksum(&bytes), original);
    }
}
