//! What a launch or foreign work declares of the memory it uses: [`Arg`] (a kernel's argument: a buffer read or
//! written, or a value) and [`Use`] (a buffer that other code's work reads or writes).

use std::ffi::c_void;
use std::fmt;

use bytemuck::Pod;

use super::module::Module;
use crate::copy::{DeviceDestination, DeviceSource, PinnedDestination, PinnedSource, sealed};
use crate::driver::{Context, Stream, calls};
use crate::error::{Error, Result};
use crate::memory::Track;
use crate::sys::CUdeviceptr;
use crate::track::Access;

/// Where a buffer of a [`Use`] lives.
#[derive(Clone, Copy, Debug)]
pub(super) enum Place<'a> {
    /// Device memory of a context.
    Device(CUdeviceptr, &'a Context),
    /// Page-locked host memory, reached by the device through its mapping.
    Host(*mut c_void),
    /// The code of a loaded module, which work launched from it reads.
    Module(&'a Context),
}

/// A buffer that device work reads or writes, as declared to the tracking: a [`Stream::launch`] argument
/// (through [`Arg`]), or what other code's work uses ([`Stream::enqueue_foreign`]).
///
/// Made from the buffer's borrow, shared for a read and exclusive for a write, so the declaration cannot
/// outlive the buffer nor overlap a host borrow of it.
pub struct Use<'a> {
    pub(super) place: Place<'a>,
    pub(super) bytes: usize,
    pub(super) track: &'a Track,
    pub(super) access: Access,
}

impl<'a> Use<'a> {
    /// Device memory that the work reads.
    pub fn read<T>(buffer: &'a impl DeviceSource<T>) -> Use<'a> {
        Use::device(buffer, Access::Read, size_of::<T>())
    }

    /// Device memory that the work writes (and may read).
    pub fn write<T: Pod>(buffer: &'a mut impl DeviceDestination<T>) -> Use<'a> {
        Use::device(&*buffer, Access::Write, size_of::<T>())
    }

    /// Page-locked host memory that the work reads through its device mapping (allocated with
    /// [`PinnedBuilder::device_mapped`](crate::PinnedBuilder::device_mapped), or any pinned memory on a
    /// system with unified addressing).
    pub fn read_host<T>(buffer: &'a impl PinnedSource<T>) -> Use<'a> {
        Use::host(buffer, Access::Read, size_of::<T>())
    }

    /// Page-locked host memory that the work writes through its device mapping: host accessors wait for it.
    pub fn write_host<T: Pod>(buffer: &'a mut impl PinnedDestination<T>) -> Use<'a> {
        Use::host(&*buffer, Access::Write, size_of::<T>())
    }

    /// The code of `module`, which a kernel of it launched through its raw handle (inside
    /// [`Stream::enqueue_foreign`]) reads: the module stays loaded until that work has run.
    pub fn module(module: &'a Module) -> Use<'a> {
        Use {
            place: Place::Module(module.context()),
            bytes: 0,
            track: &module.0.track,
            access: Access::Read,
        }
    }

    fn device(buffer: &'a impl sealed::DeviceMemory, access: Access, element: usize) -> Use<'a> {
        Use {
            place: Place::Device(buffer.device_ptr(), buffer.owner()),
            bytes: buffer.elements() * element,
            track: buffer.track(),
            access,
        }
    }

    fn host(buffer: &'a impl sealed::PinnedMemory, access: Access, element: usize) -> Use<'a> {
        Use {
            place: Place::Host(buffer.host_ptr()),
            bytes: buffer.elements() * element,
            track: buffer.track(),
            access,
        }
    }

    /// The device address of device memory; `None` for host memory (whose device address the launch looks
    /// up in the stream's context).
    #[must_use]
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        match self.place {
            Place::Device(ptr, _) => Some(ptr),
            Place::Host(_) | Place::Module(_) => None,
        }
    }

    /// The size in bytes of the memory used.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// Whether the work writes the memory.
    #[must_use]
    pub fn is_write(&self) -> bool {
        self.access == Access::Write
    }

    /// Checks that device memory belongs to `stream`'s context.
    pub(super) fn check_context(
        &self,
        stream: &Stream,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        match self.place {
            Place::Device(_, owner) if owner != stream.context() => {
                Err(Error::invalid(format_args!(
                    "{}: a buffer of device {} used on a stream of device {}; nothing was enqueued",
                    what(),
                    owner.device().ordinal(),
                    stream.context().device().ordinal()
                )))
            }
            Place::Module(owner) if owner != stream.context() => Err(Error::invalid(format_args!(
                "{}: a module loaded on device {} declared on a stream of device {}; nothing was enqueued",
                what(),
                owner.device().ordinal(),
                stream.context().device().ordinal()
            ))),
            _ => Ok(()),
        }
    }

    /// The address the device sees, looked up in the current context for host memory.
    pub(super) fn address(&self, kernel: &str) -> Result<CUdeviceptr> {
        match self.place {
            Place::Device(ptr, _) => Ok(ptr),
            // Nothing to look up, and nothing the kernel may touch: an empty buffer passes a null pointer.
            Place::Host(_) if self.bytes == 0 => Ok(0),
            Place::Module(_) => Ok(0),
            Place::Host(host) => calls::mem_host_get_device_pointer(host).map_err(|e| {
                e.context(format_args!(
                    "passing page-locked host memory to `{kernel}`: it is not mapped into the device's address \
                     space (allocate it with PinnedBuilder::device_mapped(true))"
                ))
            }),
        }
    }
}

impl fmt::Debug for Use<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Use")
            .field("place", &self.place)
            .field("bytes", &self.bytes)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// An argument of a kernel launch: a buffer and how the kernel uses it, or a value passed by copy.
#[derive(Debug)]
pub struct Arg<'a>(pub(super) ArgKind<'a>);

#[derive(Debug)]
pub(super) enum ArgKind<'a> {
    Value(&'a [u8]),
    Memory(Use<'a>),
}

impl<'a> Arg<'a> {
    /// A pointer to device memory that the kernel reads (`const T*`).
    pub fn read<T>(buffer: &'a impl DeviceSource<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::read(buffer)))
    }

    /// A pointer to device memory that the kernel writes (`T*`).
    pub fn write<T: Pod>(buffer: &'a mut impl DeviceDestination<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::write(buffer)))
    }

    /// A pointer to mapped page-locked host memory that the kernel reads ([`Use::read_host`]).
    pub fn read_host<T>(buffer: &'a impl PinnedSource<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::read_host(buffer)))
    }

    /// A pointer to mapped page-locked host memory that the kernel writes ([`Use::write_host`]).
    pub fn write_host<T: Pod>(buffer: &'a mut impl PinnedDestination<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::write_host(buffer)))
    }

    /// A value passed by copy (a scalar or a `#[repr(C)]` struct of the parameter's type).
    pub fn value<T: Pod>(value: &'a T) -> Arg<'a> {
        Arg(ArgKind::Value(bytemuck::bytes_of(value)))
    }

    /// The size in bytes the argument takes in the kernel's parameters.
    pub(super) fn size(&self) -> usize {
        match &self.0 {
            ArgKind::Value(bytes) => bytes.len(),
            ArgKind::Memory(_) => size_of::<CUdeviceptr>(),
        }
    }
}

impl<'a> From<Use<'a>> for Arg<'a> {
    fn from(used: Use<'a>) -> Arg<'a> {
        Arg(ArgKind::Memory(used))
    }
}
