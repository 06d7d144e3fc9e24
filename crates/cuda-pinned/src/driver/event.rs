//! CUDA events: points in a stream's work that the host or other streams can wait for, and that time it.

#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::calls;
use super::context::Context;
use crate::error::Result;
use crate::sys::{CUevent, CUevent_flags};

/// A CUDA event of a context. Record it on a stream; it completes once the work enqueued on the stream before
/// it has run.
pub struct Event {
    shared: Arc<Shared>,
    timing: bool,
}

/// The driver's event, destroyed when the last holder goes: the [`Event`], and the reactor while a future of it
/// is pending (`future/done.rs`).
pub(crate) struct Shared {
    raw: CUevent,
    context: Context,
}

// SAFETY: a CUevent is a driver handle usable from any thread; the driver synchronises its use.
unsafe impl Send for Shared {}
// SAFETY: every use takes `&self` and only passes the handle to thread-safe driver calls.
unsafe impl Sync for Shared {}

impl Shared {
    /// The driver's handle, valid while this lives.
    pub(crate) fn raw(&self) -> CUevent {
        self.raw
    }
}

impl Event {
    /// An event that can time work ([`Event::elapsed_since`]).
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuEventCreate")]
    pub fn new(context: &Context) -> Result<Event> {
        Event::create(context, CUevent_flags::CU_EVENT_DEFAULT, true)
    }

    /// An event for ordering only, which cannot time: cheaper to record and to wait for.
    ///
    /// # Errors
    /// The driver's.
    pub fn without_timing(context: &Context) -> Result<Event> {
        Event::create(context, CUevent_flags::CU_EVENT_DISABLE_TIMING, false)
    }

    fn create(context: &Context, flags: CUevent_flags, timing: bool) -> Result<Event> {
        let _current = context.enter()?;
        // The context is current; destroyed in Drop.
        let raw = calls::event_create(flags.0).map_err(|e| e.context("creating an event"))?;
        Ok(Event {
            shared: Arc::new(Shared {
                raw,
                context: context.clone(),
            }),
            timing,
        })
    }

    /// Blocks until the event has completed (returns at once if it was never recorded).
    ///
    /// # Errors
    /// The driver's, including errors of the work before the event.
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        calls::event_synchronize(self.as_raw()).map_err(|e| e.context("waiting for an event"))
    }

    /// Whether the event has completed, without blocking.
    ///
    /// # Errors
    /// The driver's, other than `CUDA_ERROR_NOT_READY` (which is `Ok(false)`).
    #[doc(alias = "cuEventQuery")]
    pub fn query(&self) -> Result<bool> {
        calls::event_query(self.as_raw()).map_err(|e| e.context("querying an event"))
    }

    /// The device time from `start` to this event, both recorded and complete (resolution about 0.5 us).
    ///
    /// # Errors
    /// `CUDA_ERROR_NOT_READY` if either has not completed; `CUDA_ERROR_INVALID_HANDLE` if either was made
    /// [`Event::without_timing`].
    #[doc(alias = "cuEventElapsedTime")]
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        let ms = calls::event_elapsed_time(start.as_raw(), self.as_raw())
            .map_err(|e| e.context("timing between two events"))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// The context the event belongs to.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.shared.context
    }

    /// The driver's handle, valid while this event lives.
    #[must_use]
    pub fn as_raw(&self) -> CUevent {
        self.shared.raw
    }

    /// The driver's event, for a holder that may outlive this value.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.as_raw())
            .field("timing", &self.timing)
            .finish()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: created in `Event::create`; its handle is valid only while the Event lives (`as_raw`), and
        // the Event and every holder of this are gone. The driver defers releasing an event whose recorded work
        // is pending.
        if let Err(e) = unsafe { calls::event_destroy(self.raw) } {
            self.context.defer_error(e.context("destroying an event"));
        }
    }
}
