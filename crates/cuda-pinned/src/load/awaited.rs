//! Loads as futures: the load runs on a thread of its own, and the future completes with what it returned, so
//! that a server loads a model while its executor's threads go on serving.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll, Waker};

use super::{LoadOptions, LoadReport};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, PinnedPool};

/// A load running on a thread of its own: completes with its result once every byte has been read and every
/// upload enqueued (the uploads then run on the load's stream, tracked like any other).
///
/// Dropping it does not stop the load: the thread finishes, and what it loaded is dropped (its device memory
/// freed after the uploads, as any buffer's).
#[must_use = "a future does nothing unless awaited"]
pub struct Loading<T> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    outcome: Option<Result<T>>,
    waker: Option<Waker>,
}

impl<T: Send + 'static> Loading<T> {
    /// Runs `load` on a new thread; the future of its result. A thread the system refuses, or a load that
    /// panics, is the future's `Err`.
    pub(crate) fn spawn(load: impl FnOnce() -> Result<T> + Send + 'static) -> Loading<T> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                outcome: None,
                waker: None,
            }),
        });
        let theirs = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("cuda-pinned-load".to_owned())
            .spawn(move || {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(load))
                    .unwrap_or_else(|_| Err(Error::invalid("the load's thread panicked")));
                theirs.finish(outcome);
            });
        if let Err(e) = spawned {
            shared.finish(Err(Error::invalid(format_args!(
                "starting a thread for the load: {e}; raise the process's thread limit"
            ))));
        }
        Loading { shared }
    }
}

impl<T> Shared<T> {
    fn finish(&self, outcome: Result<T>) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.outcome = Some(outcome);
            state.waker.take()
        };
        // Woken with no lock held: a waker is the executor's code.
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Loading<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<T>> {
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(outcome) = state.outcome.take() {
            return Poll::Ready(outcome);
        }
        let old = match &state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => None,
            _ => state.waker.replace(cx.waker().clone()),
        };
        drop(state);
        // The waker of an earlier poll, dropped with no lock held.
        drop(old);
        Poll::Pending
    }
}

impl Stream {
    /// Allocates `len` bytes of device memory on this stream and loads bytes `offset..offset + len` of `path`
    /// into them, as [`Stream::load_file_with`] does, on a thread of its own: the future completes once every
    /// byte has been read (the uploads running on this stream) with the buffer and the load's report.
    ///
    /// # Errors
    /// The future's: as [`Stream::load_file_with`], and the allocation's.
    pub fn load_file_async(
        &self,
        pool: &PinnedPool,
        options: LoadOptions,
        path: impl Into<PathBuf>,
        offset: u64,
        len: usize,
    ) -> Loading<(DeviceBuffer<u8>, LoadReport)> {
        let (stream, pool, path) = (self.clone(), pool.clone(), path.into());
        Loading::spawn(move || {
            let mut buffer = DeviceBuffer::<u8>::uninit(&stream, len)?;
            let report = stream.load_file_with(&pool, options, &path, offset, &mut buffer)?;
            Ok((buffer, report))
        })
    }
}

#[cfg(feature = "safetensors")]
impl super::Checkpoint {
    /// [`Checkpoint::load_with`](super::Checkpoint::load_with) on a thread of its own: the future completes
    /// once every byte has been read, the uploads running on `stream`.
    ///
    /// # Errors
    /// The future's: as [`Checkpoint::load_with`](super::Checkpoint::load_with).
    pub fn load_async(
        &self,
        stream: &Stream,
        pool: &PinnedPool,
        options: LoadOptions,
    ) -> Loading<super::LoadedCheckpoint> {
        let (checkpoint, stream, pool) = (self.clone(), stream.clone(), pool.clone());
        Loading::spawn(move || checkpoint.load_with(&stream, &pool, options))
    }
}
