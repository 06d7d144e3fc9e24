//! The streams a context knows: registered by the streams it makes, listed for `Context::synchronize` and the
//! futures, and retired (destroyed once idle) when the crate is done with them, so that the release thread
//! sees their work until then.

#![allow(unsafe_code)]

use std::sync::{Arc, Weak};

use super::super::calls;
use super::super::device::Device;
use super::{Context, DEVICES, Known, lock};
use crate::error::{Error, Result};
use crate::sys::{CUstream, CUstream_flags};

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

/// Destroys `stream`, a stream of `device`'s primary context made by [`Context::create_stream`] with no handle
/// left, at once if it is idle, else once it is: kept until then in the device's list, with the retain of the
/// context it was made with, so that [`Context::device_is_idle`] sees the work still queued on it. Nothing here
/// can fail to keep it (a retain taken now could: the release thread would then not see its work). Call it under
/// the device's gate. The errors of the query and of the destruction go to `report`.
pub(super) fn retire(device: Device, stream: CUstream, report: impl Fn(Error)) {
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
pub(super) fn sweep(known: &mut Known, device: Device) -> Vec<Error> {
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
    pub(super) fn alive(&self) -> Vec<Context> {
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
pub(super) fn report_sweep(contexts: &[Context], errors: Vec<Error>) {
    for error in errors {
        for context in contexts {
            context.defer_error(error.clone());
        }
    }
}

/// The streams a context knows ([`Context::known_streams`]).
pub(crate) struct KnownStreams {
    /// The streams made or wrapped by the crate.
    pub(crate) made: Vec<Arc<dyn Queue>>,
    /// Each handle's stream for frees, with the handle that owns it.
    pub(crate) released: Vec<(Context, CUstream)>,
}

/// A stream of [`Known::draining`].
pub(super) struct Draining(pub(super) CUstream);

// SAFETY: a stream handle, which the driver lets any thread use; only passed to driver calls.
unsafe impl Send for Draining {}

impl Context {
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

    /// Every stream the crate knows in this context, through any handle of it: the streams made or wrapped by
    /// the crate, and each handle's stream for frees (with the handle that owns it).
    pub(crate) fn known_streams(&self) -> KnownStreams {
        let handles = lock(&DEVICES)
            .iter()
            .find(|d| d.device.ordinal() == self.0.device.ordinal())
            .map(Known::alive)
            .unwrap_or_default();
        let (mut made, mut released) = (Vec::new(), Vec::new());
        for handle in &handles {
            made.extend(lock(&handle.0.streams).iter().filter_map(Weak::upgrade));
            let release = *lock(&handle.0.release_stream);
            if !release.is_null() {
                released.push((handle.clone(), release));
            }
        }
        KnownStreams { made, released }
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

    /// The devices the crate has made a context on, in the order it first did.
    pub(crate) fn known_devices() -> Vec<Device> {
        lock(&DEVICES).iter().map(|d| d.device).collect()
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
}
