//! The crate's memory pool of each device's memory, which `DeviceBuffer`s come from: made on first use, never
//! the device's current pool (which belongs to whoever set it), keeping freed memory for the next allocations.

#![allow(unsafe_code)]

use std::ffi::c_int;

use super::super::calls;
use super::super::device::Device;
use super::{Context, DEVICES, lock};
use crate::error::{Error, Result};
use crate::sys::CUmemoryPool;

/// A memory pool of `device`'s memory whose allocations never wait for other streams' pending frees (see
/// [`Context::memory_pool`]).
pub(super) fn create_pool(device: Device, kept: u64) -> Result<CUmemoryPool> {
    let ordinal = c_int::try_from(device.ordinal()).unwrap_or(c_int::MAX);
    let pool = calls::mem_pool_create(ordinal)?;
    let set = calls::mem_pool_set_internal_dependencies(pool, false)
        .and_then(|()| calls::mem_pool_set_release_threshold(pool, kept));
    if let Err(e) = set {
        // Nothing was allocated from it.
        let _ = calls::mem_pool_destroy(pool);
        return Err(e);
    }
    Ok(pool)
}

/// How many bytes of freed device memory the crate's memory pool of a device keeps reserved at a
/// synchronization unless set otherwise ([`Context::set_device_memory_kept`]): all of it, as a caching
/// allocator does, since mapping device memory afresh costs a step that allocates it far more than the step's
/// own work (docs/performance.md).
pub const DEVICE_MEMORY_KEPT: u64 = u64::MAX;

/// A memory pool of [`Known::pool`].
pub(super) struct DevicePool(pub(super) CUmemoryPool);

// SAFETY: a pool handle, which the driver lets any thread use; only passed to driver calls.
unsafe impl Send for DevicePool {}

impl Context {
    /// Whether device memory is allocated stream-ordered (from [`Context::memory_pool`]) in this context.
    pub(crate) fn has_memory_pools(&self) -> bool {
        self.0.memory_pools
    }

    /// The memory pool the crate allocates the device's memory from (`cuMemAllocFromPoolAsync`): one of its
    /// own per device, made on first use, rather than the device's current pool, which belongs to whoever set
    /// it. Its allocations never reuse memory whose free is still pending on another stream by making their
    /// stream wait for that one (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES` off): the driver would
    /// otherwise do so under memory pressure, making a stream wait for unrelated work. Such an allocation
    /// fails with `CUDA_ERROR_OUT_OF_MEMORY` instead. Peer access is granted on this pool only.
    ///
    /// # Errors
    /// The driver's, from creating the pool or setting its attribute (nothing is kept then: the next call tries
    /// again).
    #[doc(alias = "cuMemPoolCreate")]
    pub(crate) fn memory_pool(&self) -> Result<CUmemoryPool> {
        if let Some(&pool) = self.0.pool.get() {
            return Ok(pool);
        }
        let device = self.device();
        let known_pool = || {
            lock(&DEVICES)
                .iter()
                .find(|d| d.device == device)
                .and_then(|d| d.pool.as_ref().map(|p| p.0))
        };
        let pool = match known_pool() {
            Some(pool) => pool,
            None => {
                // Made outside the list's lock (two driver calls), in this context; should another thread have
                // made one meanwhile, that one is kept and this one destroyed, unused.
                let kept = lock(&DEVICES)
                    .iter()
                    .find(|d| d.device == device)
                    .map_or(DEVICE_MEMORY_KEPT, |d| d.kept);
                let made = {
                    let _current = self.enter()?;
                    create_pool(device, kept).map_err(|e| {
                        e.context(format_args!(
                            "creating the memory pool of device {}",
                            device.ordinal()
                        ))
                    })?
                };
                let mut devices = lock(&DEVICES);
                let known = devices.iter_mut().find(|d| d.device == device);
                match known.map(|d| (d.pool.get_or_insert(DevicePool(made)).0, d.kept)) {
                    Some((pool, now)) => {
                        // A setting changed while the pool was made: applied under the list's lock, as
                        // `set_device_memory_kept` applies it, so that the last one set wins.
                        let applied = if pool == made && now != kept {
                            calls::mem_pool_set_release_threshold(pool, now)
                        } else {
                            Ok(())
                        };
                        drop(devices);
                        if pool != made {
                            let _ = calls::mem_pool_destroy(made);
                        }
                        applied?;
                        pool
                    }
                    None => {
                        drop(devices);
                        let _ = calls::mem_pool_destroy(made);
                        return Err(Error::invalid(format_args!(
                            "device {} has no context of the crate",
                            device.ordinal()
                        )));
                    }
                }
            }
        };
        Ok(*self.0.pool.get_or_init(|| pool))
    }

    /// Sets how many bytes of freed device memory the crate's memory pool of this device keeps reserved when a
    /// stream, an event or the context is synchronized, for its next allocations; what it holds beyond that
    /// goes back to the driver then (the pool's `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`). Kept memory lets a loop
    /// that allocates and frees device memory each step, and synchronizes between steps, reuse the same memory
    /// rather than have the driver map it afresh each step (docs/performance.md, "Where the defaults come
    /// from"). The pool serves any of its allocations, of any size, from what it
    /// keeps; other code on the device (another library's allocations) cannot use it meanwhile: give it back
    /// with [`Context::trim_device_memory`] where such code needs the memory. The default is
    /// [`DEVICE_MEMORY_KEPT`]: everything. One setting per device, shared by every context handle of it.
    ///
    /// # Errors
    /// An invalid-argument error where the device has no memory pools (its memory is then allocated with
    /// `cuMemAlloc` and goes back to the driver when freed); the driver's.
    #[doc(alias = "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD")]
    pub fn set_device_memory_kept(&self, bytes: u64) -> Result<()> {
        self.check_memory_pools("setting how much freed device memory is kept")?;
        let device = self.device();
        let mut devices = lock(&DEVICES);
        let known = devices
            .iter_mut()
            .find(|d| d.device == device)
            .expect("a context's device is known");
        // The pool's attribute set under the list's lock: concurrent settings reach the pool in the order they
        // are recorded.
        if let Some(pool) = &known.pool {
            calls::mem_pool_set_release_threshold(pool.0, bytes)?;
        }
        known.kept = bytes;
        Ok(())
    }

    /// How many bytes of freed device memory the crate's memory pool of this device keeps reserved at a
    /// synchronization (see [`Context::set_device_memory_kept`]).
    ///
    /// # Errors
    /// An invalid-argument error where the device has no memory pools.
    pub fn device_memory_kept(&self) -> Result<u64> {
        self.check_memory_pools("reading how much freed device memory is kept")?;
        let device = self.device();
        Ok(lock(&DEVICES)
            .iter()
            .find(|d| d.device == device)
            .map_or(DEVICE_MEMORY_KEPT, |d| d.kept))
    }

    /// Returns to the driver now the freed device memory that the crate's memory pool of this device keeps
    /// beyond `keep` bytes (`cuMemPoolTrimTo`), for other code on the device to use. Memory whose free is still
    /// queued behind work, or was not yet seen done by a synchronization, may stay. Nothing to do before the
    /// pool's first allocation.
    ///
    /// # Errors
    /// As [`Context::set_device_memory_kept`].
    #[doc(alias = "cuMemPoolTrimTo")]
    pub fn trim_device_memory(&self, keep: usize) -> Result<()> {
        self.check_memory_pools("returning kept device memory")?;
        match self.made_pool() {
            Some(pool) => calls::mem_pool_trim_to(pool, keep),
            None => Ok(()),
        }
    }

    /// Bytes of device memory the crate's memory pool of this device holds from the driver: its live
    /// allocations and the freed memory it keeps (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`). 0 where the device
    /// has no memory pools, or before the pool's first allocation.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT")]
    pub fn device_memory_reserved(&self) -> Result<u64> {
        match self.made_pool() {
            Some(pool) => calls::mem_pool_attribute_u64(
                pool,
                crate::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            ),
            None => Ok(0),
        }
    }

    /// The crate's memory pool of this device if it has been made (by this handle or another), without making
    /// it.
    fn made_pool(&self) -> Option<CUmemoryPool> {
        if let Some(&pool) = self.0.pool.get() {
            return Some(pool);
        }
        let device = self.device();
        lock(&DEVICES)
            .iter()
            .find(|d| d.device == device)
            .and_then(|d| d.pool.as_ref().map(|p| p.0))
    }

    /// An invalid-argument error for `what` where the device has no memory pools.
    fn check_memory_pools(&self, what: &str) -> Result<()> {
        if self.has_memory_pools() {
            return Ok(());
        }
        Err(Error::invalid(format_args!(
            "{what}: device {} has no memory pools (its memory is allocated with cuMemAlloc and goes back to \
             the driver when freed)",
            self.device().ordinal()
        )))
    }
}
