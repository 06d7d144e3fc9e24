//! A device's primary context: the one the CUDA runtime, cuBLAS, PyTorch and other crates in the same process
//! use too, so that memory and streams pass between them.

use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard, Weak};

use super::calls;
use super::device::Device;
use crate::error::{Error, Result};
use crate::sys::{CUcontext, CUevent, CUevent_flags, CUmemoryPool, CUstream, CUstream_flags};

/// The primary context of a device, retained while any clone (or any stream, event or buffer made in it) lives.
///
/// Every operation of the crate that needs a current context makes this one current on the calling thread for
/// its duration and then puts back whatever context the thread had before, so it never clobbers another
/// library's current context. Work enqueued on a stream runs with the stream's context current too: some copies
/// take their context from the thread, not the stream. Recording events, waiting for them, and querying or
/// synchronizing streams and events take it from their handles, whatever is current (seen on GPUs in every
/// thread state, ARCHITECTURE.md).
#[derive(Clone)]
pub struct Context(Arc<Inner>);

struct Inner {
    device: Device,
    raw: CUcontext,
    /// Whether the device supports stream-ordered allocation, read once: device memory is allocated with it.
    memory_pools: bool,
    /// Whether the driver shows the process no device but this one, read once: then no other device's context
    /// can be current on any thread (see [`Context::enqueue_copy`]).
    sole_device: bool,
    /// The device's memory pool of the crate ([`Context::memory_pool`]), once this handle has asked for it.
    pool: OnceLock<CUmemoryPool>,
    /// Errors that a destructor met and could not return (a failed wait before a release, say): kept for
    /// [`Context::check_deferred_errors`] rather than lost or turned into a panic.
    deferred: Mutex<Vec<Error>>,
    /// Events for ordering, recorded without timing, ready for reuse (see `marks.rs`).
    events: Mutex<Vec<CUevent>>,
    /// The streams made in the context, so that `synchronize` can close their segments.
    streams: Mutex<Vec<Weak<dyn Queue>>>,
    /// The crate's own stream for frees that must wait for several streams (null until first needed).
    release_stream: Mutex<CUstream>,
    /// The device's gate (shared by every context handle of the device): the crate's work holds it for
    /// reading while it enqueues, the release thread for writing while it finds the device idle and unpins
    /// (see `memory/release.rs`).
    gate: &'static RwLock<()>,
    /// What this handle knows of peer access from the context to others (see `peer.rs`).
    peers: Mutex<Peers>,
}

/// Peer access from a context to the others, as far as one handle has seen it.
#[derive(Default)]
pub(crate) struct Peers {
    /// Devices (ordinals) whose memory the device can or cannot access directly (`cuDeviceCanAccessPeer`): a
    /// property of the hardware, asked once; also `false` where the driver refused to enable access.
    reachable: Vec<(usize, bool)>,
    /// Context handles to whose memory access was enabled while they lived: the access lasts while one of
    /// them does (their primary context is retained meanwhile), so it is enabled again only after.
    enabled: Vec<Weak<Inner>>,
}

impl Peers {
    /// Whether access to `peer`'s memory was enabled while `peer`'s handle lived.
    pub(crate) fn is_enabled(&self, peer: &Context) -> bool {
        self.enabled
            .iter()
            .any(|c| std::ptr::eq(c.as_ptr(), Arc::as_ptr(&peer.0)))
    }

    /// Whether the device can access the memory of device `ordinal`, if known.
    pub(crate) fn reachable(&self, ordinal: usize) -> Option<bool> {
        self.reachable
            .iter()
            .find_map(|&(o, can)| (o == ordinal).then_some(can))
    }

    /// Notes whether the device can access the memory of device `ordinal` (`false` also where the driver
    /// refused to enable it: copies go through page-locked memory from then on).
    pub(crate) fn set_reachable(&mut self, ordinal: usize, can: bool) {
        self.reachable.retain(|(o, _)| *o != ordinal);
        self.reachable.push((ordinal, can));
    }

    /// Notes that access to `peer`'s memory is enabled, forgetting handles that are gone.
    pub(crate) fn set_enabled(&mut self, peer: &Context) {
        self.enabled.retain(|c| c.strong_count() > 0);
        self.enabled.push(Arc::downgrade(&peer.0));
    }
}

thread_local! {
    /// How many gates the thread holds (see [`Context::enqueue_gate`]).
    static GATES_HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A stream of the context as the context sees it: what [`Context::synchronize`] and the release thread need of
/// the crate's streams, which implement it (`stream.rs`), so that the context does not depend on the stream.
pub(crate) trait Queue: std::any::Any + Send + Sync {
    /// Closes the stream's current segment (see `marks.rs`), as `Stream::close_segment` does.
    ///
    /// # Errors
    /// The driver's, from recording the segment's event.
    fn close_segment(self: Arc<Self>) -> Result<()>;

    /// Whether all work enqueued on the stream has completed, without blocking, as [`Stream::query`] says.
    ///
    /// # Errors
    /// The driver's, other than `CUDA_ERROR_NOT_READY`.
    ///
    /// [`Stream::query`]: super::Stream::query
    fn query(self: Arc<Self>) -> Result<bool>;

    /// Whether the stream is in a capture of the crate's (`graph.rs`).
    fn is_capturing(&self) -> bool;
}

/// A device's gate held for reading by this thread (see [`Context::enqueue_gate`]).
pub(crate) struct Gate<'a> {
    _read: Option<RwLockReadGuard<'a, ()>>,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        GATES_HELD.set(GATES_HELD.get() - 1);
    }
}

/// Takes `gate` for reading, unless the thread holds a gate already (see [`Context::enqueue_gate`]).
fn enter_gate(gate: &'static RwLock<()>) -> Gate<'static> {
    let held = GATES_HELD.get();
    GATES_HELD.set(held + 1);
    Gate {
        _read: (held == 0).then(|| gate.read().unwrap_or_else(PoisonError::into_inner)),
    }
}

/// Destroys `stream`, a stream of `device`'s primary context made by [`Context::create_stream`] with no handle
/// left, at once if it is idle, else once it is: kept until then in the device's list, with the retain of the
/// context it was made with, so that [`Context::device_is_idle`] sees the work still queued on it. Nothing here
/// can fail to keep it (a retain taken now could: the release thread would then not see its work). Call it under
/// the device's gate. The errors of the query and of the destruction go to `report`.
fn retire(device: Device, stream: CUstream, report: impl Fn(Error)) {
    let busy = match calls::stream_query(stream) {
        Ok(idle) => !idle,
        Err(e) => {
            report(e.context("querying a stream as it is destroyed"));
            true
        }
    };
    if busy {
        let mut devices = lock(&DEVICES);
        if let Some(known) = devices.iter_mut().find(|d| d.device == device) {
            known.draining.push(Draining(stream));
            return;
        }
    }
    // SAFETY: a stream with no handle left. Work still pending on it completes first: the driver releases the
    // stream afterwards. The release balances the retain the stream was made with, which nothing else relies on.
    unsafe {
        if let Err(e) = calls::stream_destroy(stream) {
            report(e.context("destroying a stream"));
        }
        let _ = calls::primary_ctx_release(device.as_raw());
    }
}

/// Destroys the streams of `known.draining` (of `device`) that are idle now, releasing the retain each was made
/// with.
fn sweep(known: &mut Known, device: Device) -> Vec<Error> {
    let mut failed = Vec::new();
    known.draining.retain(|&Draining(stream)| {
        // A stream of the device's primary context, which it keeps retained. It goes once the query says it
        // is idle. A query that fails says nothing: the stream stays, still counted busy, and is asked again
        // next time (taken for idle, its queued work was seen to make the device's next unpinning wait: a
        // hidden wait, found by failing each driver call of the gather's prefetcher in turn). The error is
        // returned, for the caller to report once it has let go of the list.
        let busy = match calls::stream_query(stream) {
            Ok(idle) => !idle,
            Err(e) => {
                failed.push(e.context("querying the work left on a dropped stream"));
                true
            }
        };
        if !busy {
            // SAFETY: no handle of the stream is left; the release balances the entry's retain, which nothing
            // else relies on. Failures leak them: harmless.
            unsafe {
                let _ = calls::stream_destroy(stream);
                let _ = calls::primary_ctx_release(device.as_raw());
            }
        }
        busy
    });
    failed
}

impl Known {
    /// Handles of the device's contexts still alive. Drop them only once the list of devices is let go: one
    /// may be the last, and a context's drop takes the list.
    fn alive(&self) -> Vec<Context> {
        self.contexts
            .iter()
            .filter_map(Weak::upgrade)
            .map(Context)
            .collect()
    }
}

/// Reports `errors` met while looking at a device through every handle of its context still alive: each
/// handle's deferred errors ([`Context::check_deferred_errors`]), so that whichever handles the user holds
/// hear of them (others may be the crate's own, such as a kept stream's). Call it without holding the list of
/// devices (a context's handle may be the last, and its drop takes the list).
fn report_sweep(contexts: &[Context], errors: Vec<Error>) {
    for error in errors {
        for context in contexts {
            context.defer_error(error.clone());
        }
    }
}

/// Work being enqueued on a stream of a context: its device's gate held for reading, its context current (see
/// [`Context::enqueue`]).
pub(crate) struct Enqueue<'a> {
    _current: Option<Current<'a>>,
    _gate: Gate<'static>,
}

/// A device's gate held for writing by this thread (see [`Context::close_gate`]).
pub(crate) struct ClosedGate {
    _write: std::sync::RwLockWriteGuard<'static, ()>,
}

impl Drop for ClosedGate {
    fn drop(&mut self) {
        GATES_HELD.set(GATES_HELD.get() - 1);
    }
}

/// A memory pool of `device`'s memory whose allocations never wait for other streams' pending frees (see
/// [`Context::memory_pool`]).
fn create_pool(device: Device, kept: u64) -> Result<CUmemoryPool> {
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

/// Every context made, by device: to find all the crate's streams on a device, and the device's gate.
static DEVICES: Mutex<Vec<Known>> = Mutex::new(Vec::new());

/// A stream of [`Known::draining`].
struct Draining(CUstream);

// SAFETY: a stream handle, which the driver lets any thread use; only passed to driver calls.
unsafe impl Send for Draining {}

/// A device the crate has made contexts on.
struct Known {
    device: Device,
    /// Streams the crate is done with (its own streams for frees too) that still had work queued, each with a
    /// retain of the device's primary context: destroyed once seen idle, so that until then the release thread
    /// sees their work.
    draining: Vec<Draining>,
    /// One per device for the life of the process (a few bytes), so that guards of it can outlive any handle.
    gate: &'static RwLock<()>,
    contexts: Vec<Weak<Inner>>,
    /// The crate's memory pool of the device, made on first use and destroyed with the device's last context
    /// handle (the driver releases it once its last allocation is freed), so that no handle of it outlives the
    /// crate's hold on the device. It keeps `kept` bytes of freed memory at a synchronization.
    pool: Option<DevicePool>,
    /// The pool's release threshold ([`Context::set_device_memory_kept`]): kept here, so that a pool made again
    /// after the device's last handle went has it too.
    kept: u64,
}

/// A memory pool of [`Known::pool`].
struct DevicePool(CUmemoryPool);

// SAFETY: a pool handle, which the driver lets any thread use; only passed to driver calls.
unsafe impl Send for DevicePool {}

/// The most idle events a context keeps for reuse; more are destroyed as they come back.
const POOLED_EVENTS: usize = 1024;

// SAFETY: a CUcontext is a handle the driver lets any thread use (make current, pass to calls) concurrently;
// the crate only ever uses it through driver calls. The pooled CUevents are handles of the same kind; the
// lists are behind Mutexes.
unsafe impl Send for Inner {}
// SAFETY: as for Send: shared use of the handle from several threads is what the driver API supports.
unsafe impl Sync for Inner {}

impl Context {
    /// Retains `device`'s primary context, creating it if no one in the process has yet (a fraction of a
    /// second the first time).
    ///
    /// Built with feature `gpu`, the first call for a device in the process also loads the crate's kernels
    /// into the context, which waits until work already running on the device (other code's) has finished;
    /// a concurrent first call for the same device waits for that loading too. Later calls, and all work
    /// queued afterwards, wait for nothing of it.
    ///
    /// # Errors
    /// The loader's error where no driver can be loaded; the driver's, such as `CUDA_ERROR_OUT_OF_MEMORY`.
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn new(device: Device) -> Result<Context> {
        let memory_pools = device.supports_memory_pools()?;
        // The devices the process sees do not change while it runs: counted once.
        static SOLE_DEVICE: OnceLock<bool> = OnceLock::new();
        let sole_device = match SOLE_DEVICE.get() {
            Some(&sole) => sole,
            None => *SOLE_DEVICE.get_or_init(|| Device::count().is_ok_and(|count| count == 1)),
        };
        // Balanced by the release in Inner's Drop.
        let raw = calls::primary_ctx_retain(device.as_raw()).map_err(|e| {
            e.context(format_args!(
                "retaining the primary context of device {}",
                device.ordinal()
            ))
        })?;
        let mut devices = lock(&DEVICES);
        let position = match devices
            .iter()
            .position(|d| d.device.ordinal() == device.ordinal())
        {
            Some(position) => position,
            None => {
                devices.push(Known {
                    device,
                    draining: Vec::new(),
                    gate: Box::leak(Box::default()),
                    contexts: Vec::new(),
                    pool: None,
                    kept: DEVICE_MEMORY_KEPT,
                });
                devices.len() - 1
            }
        };
        let known = &mut devices[position];
        let context = Context(Arc::new(Inner {
            device,
            raw,
            memory_pools,
            sole_device,
            pool: OnceLock::new(),
            deferred: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            release_stream: Mutex::new(std::ptr::null_mut()),
            gate: known.gate,
            peers: Mutex::new(Peers::default()),
        }));
        // Each entry is removed by its context's drop, once that has retired the context's own stream.
        known.contexts.push(Arc::downgrade(&context.0));
        drop(devices);
        // Loading the crate's kernels waits for all work on the device: done now, before any work of the
        // crate can be queued on it (see `kernels_ffi::preload`).
        #[cfg(feature = "gpu")]
        crate::kernels_ffi::preload(device.ordinal(), || {
            context
                .enter()
                .and_then(|_current| crate::kernels_ffi::load_into_current())
        });
        Ok(context)
    }

    /// The primary context of the device with this ordinal: `Context::on(0)` for the first GPU.
    ///
    /// # Errors
    /// As [`Device::get`] and [`Context::new`].
    pub fn on(ordinal: usize) -> Result<Context> {
        Context::new(Device::get(ordinal)?)
    }

    /// The context's device.
    #[must_use]
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// Keeps the context for the rest of the process, for memory of it that is leaked because its work cannot
    /// be known to be complete: destroying the context would free that memory under the work all the same
    /// (the driver's destruction waits only for the context's own streams, not for another device's stream
    /// that reads the memory).
    ///
    /// A retain of the primary context of its own, never released: not a handle of the crate, which would
    /// keep the context's streams and its list of deferred errors alive too. Should the retain fail, there
    /// is nothing more to do.
    pub(crate) fn keep_for_leaked_memory(&self) {
        let _ = calls::primary_ctx_retain(self.device().as_raw());
    }

    /// What this handle knows of peer access (see `peer.rs`).
    pub(crate) fn peers(&self) -> MutexGuard<'_, Peers> {
        lock(&self.0.peers)
    }

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
    /// rather than have the driver map it afresh each step (on an H100, a step that allocates 1 GiB took 2.9 ms
    /// with nothing kept against 5 us kept). The pool serves any of its allocations, of any size, from what it
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

    /// The driver's handle, for interop with other CUDA libraries. It stays valid while this context lives.
    #[must_use]
    pub fn as_raw(&self) -> CUcontext {
        self.0.raw
    }

    // `Context::synchronize`, which waits for the release thread too, is in `memory/release.rs`.

    /// Closes the current segment of every stream of the context still alive (see `marks.rs`), as
    /// [`Context::synchronize`] does first. Tries every stream; returns the first error.
    pub(crate) fn close_segments(&self) -> Result<()> {
        let streams = lock(&self.0.streams).clone();
        let mut first = Ok(());
        for stream in streams.iter().filter_map(Weak::upgrade) {
            let closed = stream.close_segment();
            if first.is_ok() {
                first = closed;
            }
        }
        first
    }

    /// Blocks until all work in the context has completed: [`Context::synchronize`]'s wait for the device.
    ///
    /// # Errors
    /// The driver's, including errors of earlier asynchronous work.
    pub(crate) fn synchronize_work(&self) -> Result<()> {
        let _current = self.enter()?;
        calls::ctx_synchronize().map_err(|e| e.context("synchronising the context"))
    }

    /// The device memory (free, total) in bytes, as the driver sees it now.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuMemGetInfo")]
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let _current = self.enter()?;
        calls::mem_get_info().map_err(|e| {
            e.context(format_args!(
                "reading the free memory of device {}",
                self.0.device.ordinal()
            ))
        })
    }

    /// The stream priorities the device supports as (least, greatest); greater priority is a *lower* number,
    /// such as (0, -5).
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuCtxGetStreamPriorityRange")]
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        let _current = self.enter()?;
        calls::ctx_stream_priority_range()
            .map_err(|e| e.context("reading the stream priority range"))
    }

    /// Errors that destructors and the crate's release thread met since the last call (a failed wait before
    /// releasing memory, say), which they could not return. Memory whose release could not be ordered safely
    /// was leaked instead.
    ///
    /// # Errors
    /// The one such error, or [`Error::Deferred`] with all of them, oldest first, when there were several.
    pub fn check_deferred_errors(&self) -> Result<()> {
        let mut errors = std::mem::take(&mut *lock(&self.0.deferred));
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Deferred { errors }),
        }
    }

    /// Keeps an error a destructor met, for [`Context::check_deferred_errors`].
    pub(crate) fn defer_error(&self, error: Error) {
        lock(&self.0.deferred).push(error);
    }

    /// [`Context::defer_error`] in every live handle of the device's context, as the release thread reports
    /// what it meets ([`report_sweep`]): the handle that met the error may be one the crate keeps for itself (a
    /// kept stream's, see `peer.rs`), and the user's are the others.
    pub(crate) fn defer_error_to_every_handle(&self, error: Error) {
        let alive = lock(&DEVICES)
            .iter()
            .find(|d| d.device.ordinal() == self.0.device.ordinal())
            .map(Known::alive)
            .unwrap_or_default();
        if alive.is_empty() {
            self.defer_error(error);
        } else {
            // The handles go after the list's lock: one may be the last of its context.
            report_sweep(&alive, vec![error]);
        }
    }

    /// Fails while a stream the crate knows in this context (through any handle of it) is in a capture: a
    /// synchronization of the context would end the capture (ARCHITECTURE.md, "Graphs").
    ///
    /// # Errors
    /// An invalid-argument error naming `what`.
    pub(crate) fn refuse_in_capture(&self, what: &str) -> Result<()> {
        let handles = lock(&DEVICES)
            .iter()
            .find(|d| d.device.ordinal() == self.0.device.ordinal())
            .map(Known::alive)
            .unwrap_or_default();
        let capturing = handles.iter().any(|handle| {
            // A copy of the list: a stream upgraded from it may lose its last other handle meanwhile, and its
            // drop takes the list's lock to leave it.
            let streams = lock(&handle.0.streams).clone();
            streams
                .iter()
                .filter_map(Weak::upgrade)
                .any(|stream| stream.is_capturing())
        });
        if capturing {
            return Err(Error::invalid(format_args!(
                "{what}: a stream of device {} is capturing a graph, which a synchronization of its context \
                 would end; synchronize the streams you need, or wait until the capture has ended; nothing was \
                 enqueued",
                self.0.device.ordinal()
            )));
        }
        Ok(())
    }

    /// Every stream the crate knows in this context, through any handle of it: the streams made or wrapped by
    /// the crate, and each handle's stream for frees (with the handle that owns it).
    pub(crate) fn known_streams(&self) -> (Vec<Arc<dyn Queue>>, Vec<(Context, CUstream)>) {
        let handles = lock(&DEVICES)
            .iter()
            .find(|d| d.device.ordinal() == self.0.device.ordinal())
            .map(Known::alive)
            .unwrap_or_default();
        let (mut streams, mut released) = (Vec::new(), Vec::new());
        for handle in &handles {
            streams.extend(lock(&handle.0.streams).iter().filter_map(Weak::upgrade));
            let release = *lock(&handle.0.release_stream);
            if !release.is_null() {
                released.push((handle.clone(), release));
            }
        }
        (streams, released)
    }

    /// Remembers a stream made in this context, for `synchronize`; forgets streams that are gone.
    pub(crate) fn register_stream(&self, stream: Weak<dyn Queue>) {
        lock(&self.0.streams).push(stream);
    }

    /// Forgets a stream of [`Context::register_stream`] as its last handle goes. Until then, the entry of a
    /// stream whose last handle is gone counts as work not finished ([`Context::device_is_idle`]): its work is
    /// out of sight between the handle's going and its joining the device's list of streams to retire.
    pub(crate) fn unregister_stream(&self, stream: *const ()) {
        lock(&self.0.streams).retain(|s| s.as_ptr().cast::<()>() != stream);
    }

    /// Holds the device's gate for reading: taken by the crate's work while it enqueues, so that the release
    /// thread, which takes it for writing, never finds the device idle while work is about to be queued. A
    /// thread that holds it already (work enqueued inside [`crate::Stream::profile`], say) does not take it
    /// again: a second read could wait behind the release thread's write, which waits for the first.
    pub(crate) fn enqueue_gate(&self) -> Gate<'static> {
        enter_gate(self.0.gate)
    }

    /// What the crate holds while it enqueues work on a stream of this context: the device's gate for reading
    /// ([`Context::enqueue_gate`]) and the context current on the calling thread ([`Context::enter`]), both
    /// until the guard drops. Work the crate enqueues on a stream is enqueued with the stream's context
    /// current, whatever the thread had current before: the driver refuses a copy of memory from a device's
    /// memory pool on that device's stream while another device's context is current (unless the pool is open
    /// to that device), and a batched copy with none current (ARCHITECTURE.md, "The driver's rules about
    /// contexts"). Costs one driver call (a thread-local read) where the context is current already, a push
    /// and a pop more where not. Two kinds of work skip it where the rules allow: a plain copy on a machine
    /// whose only device is this one ([`Context::enqueue_copy`]) and a kernel launch through `cuLaunchKernel`
    /// ([`Context::enqueue_launch`]).
    ///
    /// # Errors
    /// The driver's, from making the context current.
    pub(crate) fn enqueue(&self) -> Result<Enqueue<'_>> {
        let current = self.enter()?;
        Ok(Enqueue {
            _current: Some(current),
            _gate: self.enqueue_gate(),
        })
    }

    /// [`Context::enqueue`] for a kernel launch through `cuLaunchKernel`, which the driver enqueues whatever
    /// context the calling thread has current (ARCHITECTURE.md, "The driver's rules about contexts"): only the
    /// gate. What the tracking itself may call meanwhile (recording and waiting for events) works in every state
    /// too, and making an event enters the context.
    pub(crate) fn enqueue_launch(&self) -> Enqueue<'_> {
        Enqueue {
            _current: None,
            _gate: self.enqueue_gate(),
        }
    }

    /// [`Context::enqueue`] for a plain copy (`cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync`, `cuMemcpyDtoDAsync`;
    /// not a batched one) on a stream of this context. The driver refuses such a copy of pool memory only
    /// while a context of another device is current (ARCHITECTURE.md, "The driver's rules about contexts": "A
    /// copy takes its device memory as seen from the thread's current context"). Where the process sees no other device, none can be: only the gate is taken, which saves
    /// reading the thread's context; else as [`Context::enqueue`].
    ///
    /// # Errors
    /// As [`Context::enqueue`].
    pub(crate) fn enqueue_copy(&self) -> Result<Enqueue<'_>> {
        if !self.0.sole_device {
            return self.enqueue();
        }
        Ok(Enqueue {
            _current: None,
            _gate: self.enqueue_gate(),
        })
    }

    /// Whether the calling thread holds a device's gate (see [`Context::enqueue_gate`]).
    pub(crate) fn holds_a_gate() -> bool {
        GATES_HELD.get() > 0
    }

    /// The devices the crate has made a context on, in the order it first did.
    pub(crate) fn known_devices() -> Vec<Device> {
        lock(&DEVICES).iter().map(|d| d.device).collect()
    }

    /// Holds the gate of `device` (see [`Context::enqueue_gate`]) for writing, if the crate has made a context
    /// on it and the gate comes free within 20 ms (`None` otherwise): no work of the crate is being
    /// enqueued on the device until the guard drops. The calling thread
    /// counts as holding a gate meanwhile, so that what it does under the guard (dropping a stream's last
    /// handle, say) does not try to take it for reading, which would never end.
    pub(crate) fn close_gate(device: Device) -> Option<ClosedGate> {
        let gate = lock(&DEVICES)
            .iter()
            .find(|d| d.device.ordinal() == device.ordinal())
            .map(|d| d.gate)?;
        // Never queued as a waiting writer: std's RwLock lets no new reader in while a writer waits, so a
        // thread enqueueing inside a user's closure (which holds the gate for reading) and waiting for another
        // thread's enqueue would hang. Readers hold the gate for an enqueue's length: polled for up to 20 ms
        // (the release thread's own time), it is free unless a user's closure holds it, and the caller tries
        // again in its next round.
        const PATIENCE: std::time::Duration = std::time::Duration::from_millis(20);
        let started = std::time::Instant::now();
        let write = loop {
            match gate.try_write() {
                Ok(write) => break write,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if started.elapsed() < PATIENCE => {
                    if started.elapsed() < std::time::Duration::from_micros(100) {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        };
        GATES_HELD.set(GATES_HELD.get() + 1);
        Some(ClosedGate { _write: write })
    }

    /// Whether every stream the crate made on `device`, in any context handle of it (and their streams for
    /// frees, and work left on streams destroyed since), has finished its work, without blocking. Hold the
    /// device's gate for writing ([`Context::close_gate`]), or work may be queued the moment after. A query
    /// that fails counts as work not finished, and its error is kept in the context (for
    /// [`Context::check_deferred_errors`]).
    pub(crate) fn device_is_idle(device: Device) -> bool {
        let (contexts, drained, failed) = {
            let mut devices = lock(&DEVICES);
            let Some(known) = devices
                .iter_mut()
                .find(|d| d.device.ordinal() == device.ordinal())
            else {
                return true;
            };
            let failed = sweep(known, device);
            // A context whose last handle is gone but whose drop has not yet handed its stream for frees over to
            // `draining` has work the release thread cannot see: not idle until it has.
            let busy = known.contexts.iter().any(|c| c.strong_count() == 0);
            (known.alive(), known.draining.is_empty() && !busy, failed)
        };
        report_sweep(&contexts, failed);
        drained
            && contexts.iter().all(|context| {
                context.idle().unwrap_or_else(|e| {
                    let e = e.context("finding whether the device is idle, to unpin memory");
                    report_sweep(&contexts, vec![e]);
                    false
                })
            })
    }

    /// Lets go of what the crate keeps to see work left on destroyed streams, on every device, where that work
    /// has completed (see [`Context::device_is_idle`]). For the release thread, once per look.
    pub(crate) fn sweep_drained() {
        let mut reports = Vec::new();
        {
            let mut devices = lock(&DEVICES);
            for known in devices.iter_mut() {
                let device = known.device;
                let failed = sweep(known, device);
                if !failed.is_empty() {
                    reports.push((known.alive(), failed));
                }
            }
        }
        for (alive, failed) in reports {
            report_sweep(&alive, failed);
        }
    }

    /// Whether the work of this context handle's streams and its stream for frees has finished.
    fn idle(&self) -> Result<bool> {
        let release = *lock(&self.0.release_stream);
        if !release.is_null() {
            // The context's own stream, alive while its context is.
            if !calls::stream_query(release)? {
                return Ok(false);
            }
        }
        // A copy of the list: a stream upgraded from it may lose its last other handle meanwhile, and its drop
        // takes the list's lock to leave it.
        let streams = lock(&self.0.streams).clone();
        for stream in &streams {
            // A stream whose last handle is going: its work is not in sight until it is retired.
            let Some(stream) = stream.upgrade() else {
                return Ok(false);
            };
            if !stream.query()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// An event of this context for ordering (recorded without timing): an idle one of the pool, else a new one.
    ///
    /// # Errors
    /// The driver's, from creating an event.
    pub(crate) fn take_event(&self) -> Result<CUevent> {
        if let Some(event) = lock(&self.0.events).pop() {
            return Ok(event);
        }
        let _current = self.enter()?;
        // The context is current. Destroyed by `give_event` or Inner's Drop.
        calls::event_create(CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
            .map_err(|e| e.context("creating an event"))
    }

    /// The crate's own stream of this context for stream-ordered frees that wait for uses on several streams:
    /// only such frees go there, so its waits delay nobody's work. Created on first use; alive while the context
    /// is (lend it for a use with `Stream::borrowed`).
    ///
    /// # Errors
    /// The driver's, from creating it.
    pub(crate) fn release_stream(&self) -> Result<CUstream> {
        let mut raw = lock(&self.0.release_stream);
        if raw.is_null() {
            let _current = self.enter()?;
            let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
            // The context is current. Retired in Inner's Drop.
            *raw = self
                .create_stream(|| calls::stream_create(flags))
                .map_err(|e| e.context("creating the stream for stream-ordered frees"))?;
        }
        Ok(*raw)
    }

    /// Makes a stream with `create` (on this context, current) that holds a retain of the device's primary
    /// context for its life: [`Context::retire_stream`] hands it over to the device's list of streams to retire
    /// with that retain, so that keeping a stream's work in sight never needs a call that could fail.
    ///
    /// # Errors
    /// The driver's, from the retain or from `create`.
    pub(crate) fn create_stream(
        &self,
        create: impl FnOnce() -> Result<CUstream>,
    ) -> Result<CUstream> {
        let device = self.0.device.as_raw();
        calls::primary_ctx_retain(device)?;
        create().inspect_err(|_| {
            // SAFETY: balances the retain above, which nothing else relies on.
            let _ = unsafe { calls::primary_ctx_release(device) };
        })
    }

    /// Destroys `stream`, made by [`Context::create_stream`] with no handle left, once its work has completed
    /// (see [`retire`]); call it under the device's gate. Errors go to the context's deferred errors.
    pub(crate) fn retire_stream(&self, stream: CUstream) {
        retire(self.0.device, stream, |e| self.defer_error(e));
    }

    /// Takes back an event of [`Context::take_event`] that nothing uses any more.
    pub(crate) fn give_event(&self, event: CUevent) {
        let mut events = lock(&self.0.events);
        if events.len() < POOLED_EVENTS {
            events.push(event);
            return;
        }
        drop(events);
        // SAFETY: an event of this context that nothing uses any more. The driver defers releasing an event
        // whose recorded work is pending.
        if let Err(e) = unsafe { calls::event_destroy(event) } {
            self.defer_error(e.context("destroying an event"));
        }
    }

    /// Makes this context current on the calling thread until the guard drops, which puts back the thread's
    /// previous context. Costs one driver call (a thread-local read) when the context is already current.
    ///
    /// # Errors
    /// The driver's.
    pub(crate) fn enter(&self) -> Result<Current<'_>> {
        let current = calls::ctx_get_current()?;
        if current == self.0.raw {
            return Ok(Current {
                context: self,
                pushed: false,
                _not_send: PhantomData,
            });
        }
        // A context retained by `self`, which outlives the guard; the guard pops it.
        calls::ctx_push_current(self.0.raw).map_err(|e| e.context("making the context current"))?;
        Ok(Current {
            context: self,
            pushed: true,
            _not_send: PhantomData,
        })
    }
}

impl Device {
    /// The device memory free now, in bytes. This needs the device's primary context: it is retained for the
    /// call, which initialises it if nothing else has (a fraction of a second, once per process).
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuMemGetInfo")]
    pub fn free_memory(&self) -> Result<usize> {
        let context = Context::new(*self)?;
        let (free, _total) = context.memory_info()?;
        // The context goes with this call: what its guard could not do (put back the thread's previous
        // context) is reported here or never.
        context.check_deferred_errors()?;
        Ok(free)
    }
}

impl PartialEq for Context {
    fn eq(&self, other: &Context) -> bool {
        self.0.raw == other.0.raw
    }
}

impl Eq for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context(device {})", self.0.device.ordinal())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let release_stream = *self
            .release_stream
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if !release_stream.is_null() {
            // Created by `release_stream`; every `Stream` lent from it held a clone of this context, so none is
            // left. Destroyed once the frees still queued on it have run, so that the release thread sees them
            // meanwhile (under the gate, so that it does not look in between). A destructor has no one to report
            // to: the errors go.
            let _gate = enter_gate(self.gate);
            retire(self.device, release_stream, drop);
        }
        // Only now may the release thread stop counting this context as busy (see `device_is_idle`). The
        // device's last handle takes the crate's memory pool with it.
        let this: *const Inner = self;
        let mut pool = None;
        for known in lock(&DEVICES).iter_mut() {
            known.contexts.retain(|c| !std::ptr::eq(c.as_ptr(), this));
            if known.device == self.device && known.contexts.iter().all(|c| c.strong_count() == 0) {
                pool = known.pool.take();
            }
        }
        if let Some(DevicePool(pool)) = pool {
            // Memory of it still allocated (frees still queued, memory leaked on purpose) stays valid: the
            // driver releases the pool once the last of it is freed. A failure leaks the pool: harmless.
            let _ = calls::mem_pool_destroy(pool);
        }
        for event in self
            .events
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            // SAFETY: an idle event of the pool; nothing else holds it. A failure leaks it: harmless.
            let _ = unsafe { calls::event_destroy(event) };
        }
        // SAFETY: balances the retain in Context::new. Everything made in the context holds a clone of it, so
        // nothing of the crate's uses the context after this. A failure leaves it retained: harmless.
        let _ = unsafe { calls::primary_ctx_release(self.device.as_raw()) };
    }
}

/// Locks one of the context's lists. Nothing under these locks panics but a bug, and a poisoned list is still a
/// list, so it is taken over.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The context made current by [`Context::enter`]; dropping it puts back the thread's previous context. Not
/// needed for safety (forgetting it only leaves the context current), only for manners towards other libraries.
pub(crate) struct Current<'a> {
    context: &'a Context,
    pushed: bool,
    /// The context stack is per thread: the guard must be dropped on the thread that made it.
    _not_send: PhantomData<*const ()>,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        if self.pushed {
            // Pops the context `enter` pushed on this thread (the guard is not Send, so this is that thread).
            if let Err(e) = calls::ctx_pop_current() {
                self.context.defer_error_to_every_handle(
                    e.context("putting back the thread's previous context"),
                );
            }
        }
    }
}
