//! A device's primary context: the one the CUDA runtime, cuBLAS, PyTorch and other crates in the same process
//! use too, so that memory and streams pass between them.

#![allow(unsafe_code)]

use super::calls;
use super::device::Device;
use crate::error::{Error, Result};
use crate::sys::{CUcontext, CUevent, CUevent_flags, CUmemoryPool, CUstream};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, Weak};

mod gate;
mod memory_pool;
mod streams;

pub(crate) use gate::Enqueue;
use gate::enter_gate;
pub use memory_pool::DEVICE_MEMORY_KEPT;
use memory_pool::DevicePool;
use streams::{Draining, report_sweep, retire};
pub(crate) use streams::{KnownStreams, Queue};

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

/// Every context made, by device: to find all the crate's streams on a device, and the device's gate.
static DEVICES: Mutex<Vec<Known>> = Mutex::new(Vec::new());

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

    /// The driver's handle, for interop with other CUDA libraries. It stays valid while this context lives.
    #[must_use]
    pub fn as_raw(&self) -> CUcontext {
        self.0.raw
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
