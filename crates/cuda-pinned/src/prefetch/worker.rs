//! The worker threads: each takes a free slot, runs the fill closure and the upload (user code) for the next
//! position, and completes the slot with the outcome, whatever that code does.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, PoisonError};

use super::slots::Assign;
use super::{Batch, FillError, Shared, Slot, mark};
use crate::error::{Error, Result};

impl<B: Batch> Shared<B> {
    /// A worker: builds batches until there are none left to build or the prefetcher stops.
    ///
    /// Every batch a worker takes is completed, with its slot and an outcome, whatever the user's code does: a
    /// panic in the fill closure or the batch's upload is caught and becomes [`Error::Worker`], its payload
    /// dropped inside a catch too (a payload's `Drop` is user code that may panic again), and should anything
    /// still unwind out of the worker, the [`Job`] guard completes the batch with an error as it goes. The
    /// consumer, waiting for that batch, always gets it or its error.
    pub(super) fn work(&self) {
        while let Some((slot, position)) = self.next_job() {
            let index = self.indices.get(position);
            let mut job = Job {
                shared: self,
                position,
                index,
                slot: Some(slot),
            };
            let slot = job
                .slot
                .as_mut()
                .expect("prefetch: a job holds its slot until it completes");
            let built = catch_user_panic(index, || self.build(index, slot));
            job.complete(built);
        }
    }

    /// Hands a worker's slot back with the outcome of its batch, and wakes those waiting on it.
    fn complete(&self, position: usize, outcome: std::result::Result<Slot<B>, (Slot<B>, Error)>) {
        let stopped = self.lock().complete(position, outcome);
        // An error frees the slot at once: another worker may take it (to find that the stream ended).
        self.freed.notify_one();
        self.completed.notify_one();
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            // Others' code, on the worker's thread: a panic in it must not end the worker.
            let _ = panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
        }
        drop(stopped);
    }

    /// The next slot to fill and the position to fill it with, waiting for a free slot; `None` once there is
    /// nothing left to build.
    fn next_job(&self) -> Option<(Slot<B>, usize)> {
        let mut state = self.lock();
        loop {
            match state.assign() {
                Assign::Fill { slot, position } => return Some((slot, position)),
                Assign::Wait => {
                    state = self
                        .freed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Assign::Done => {
                    // The other workers waiting for a slot are done too: let them see it.
                    self.freed.notify_all();
                    return None;
                }
            }
        }
    }

    /// Fills `slot` with batch `index` and enqueues its upload.
    fn build(&self, index: usize, slot: &mut Slot<B>) -> Result<()> {
        (self.fill)(index, &mut slot.host).map_err(|e| fill_error(index, e))?;
        let _uploading = self
            .uploading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        slot.host.upload(&self.copy, &mut slot.device)?;
        // Recorded right after this batch's uploads, the events are what the consumer stream waits for on
        // delivery; left to the tracker's lazy recording, they would come at delivery, after whatever other
        // batches' uploads were enqueued by then.
        mark::<B>(&slot.device)
    }
}

/// A batch a worker is building: completed with its outcome by [`Job::complete`], or, if the worker unwinds
/// before that, by the guard's drop with an error, so that the consumer never waits for a batch nobody builds.
struct Job<'a, B: Batch> {
    shared: &'a Shared<B>,
    position: usize,
    index: usize,
    /// `Some` until completed.
    slot: Option<Slot<B>>,
}

impl<B: Batch> Job<'_, B> {
    fn complete(mut self, built: Result<()>) {
        let slot = self
            .slot
            .take()
            .expect("prefetch: a job holds its slot until it completes");
        let outcome = match built {
            Ok(()) => Ok(slot),
            Err(e) => Err((slot, e)),
        };
        self.shared.complete(self.position, outcome);
    }
}

impl<B: Batch> Drop for Job<'_, B> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let error = Error::Worker {
            index: self.index,
            message: "the worker stopped while building the batch".to_string(),
            panicked: true,
            cause: None,
        };
        self.shared.complete(self.position, Err((slot, error)));
    }
}

/// Runs user code (the fill closure, the batch's upload) for batch `index`, turning a panic into
/// [`Error::Worker`]. The panic's payload is dropped inside a catch as well: its `Drop` is user code too, and
/// a payload whose drop panics is forgotten rather than allowed to stop the worker.
fn catch_user_panic(index: usize, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let payload = match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(built) => return built,
        Err(payload) => payload,
    };
    let message = panic_message(payload.as_ref());
    drop_payload(payload);
    Err(Error::Worker {
        index,
        message,
        panicked: true,
        cause: None,
    })
}

/// Drops a panic's payload, catching a panic of its `Drop`; that second panic's payload is forgotten, not
/// dropped, since its drop could panic in turn.
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// The fill closure's error for batch `index`, as the consumer receives it.
fn fill_error(index: usize, error: FillError) -> Error {
    match error.downcast::<Error>() {
        Ok(error) => *error,
        Err(error) => Error::Worker {
            index,
            message: error.to_string(),
            panicked: false,
            cause: Some(Arc::from(error)),
        },
    }
}

/// A panic's message, where it has one.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "a panic whose payload is not a string".to_string()
    }
}
