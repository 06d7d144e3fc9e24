//! Sizes and alignments of buffers, checked before anything is allocated.

use crate::error::{Error, Result};

/// The size in bytes of `len` elements of `T`, or an error naming `what` if it overflows.
pub(crate) fn byte_len<T>(len: usize, what: &str) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| {
        Error::invalid(format_args!(
            "{what}: {len} elements of {} bytes overflow usize",
            size_of::<T>()
        ))
    })
}

/// Checks that memory aligned to `align` bytes (a page, say) can hold elements of `T`: an element type aligned
/// more strictly than the memory the crate gets from the driver would give misaligned slices.
///
/// # Errors
/// An invalid-argument error naming the type's alignment, the memory's and `what` was being made.
pub(crate) fn check_alignment<T>(align: usize, what: &str) -> Result<()> {
    if align_of::<T>() <= align {
        return Ok(());
    }
    Err(Error::invalid(format_args!(
        "{what}: {} is aligned to {} bytes, more than the {align} bytes this memory is guaranteed to be; \
         nothing was allocated",
        std::any::type_name::<T>(),
        align_of::<T>()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_lengths_are_errors() {
        assert_eq!(byte_len::<u32>(10, "x").unwrap(), 40);
        let e = byte_len::<u64>(usize::MAX / 4, "allocating").unwrap_err();
        assert!(e.to_string().starts_with("allocating: "), "{e}");
    }
}
