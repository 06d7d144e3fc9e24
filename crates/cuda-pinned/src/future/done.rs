//! [`Done`]: a future that completes once some device work has, served by the process's reactor
//! (`reactor.rs`), so that an async task learns it without blocking its executor's thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use super::reactor::reactor;
use crate::driver::calls;
use crate::driver::context::KnownStreams;
use crate::driver::marks::{Mark, PooledEvent};
use crate::driver::{Context, Event, Stream};
use crate::error::{Error, Result};
use crate::sync::flags::{FlagRef, Signal};

/// A future that completes once some device work has completed: the work queued on a stream before
/// [`Stream::done`], or the work before an [`Event`] ([`Event::done`]).
///
/// It is only a notification: it owns nothing the work uses, so dropping it before it completes, or forgetting
/// it, changes nothing but that nobody is told (a forgotten one leaks itself, and the reactor lets go of its
/// point once that completes). The host learns of the completion from the process's one reactor thread, which
/// wakes the task; no thread blocks per future. [`Done::spin_for`] trades the polling thread's time for a
/// quicker answer.
///
/// # Errors
/// It resolves to `Err` if the point could not be queued (the error is kept and returned at the first poll),
/// and when the device work fails: a context with a sticky error (a kernel that trapped) ends every future
/// waiting on it with that error, within about a millisecond.
#[must_use = "a future does nothing unless awaited"]
pub struct Done {
    state: State,
    /// How long the first poll spins before it leaves the waiting to the reactor.
    spin: Duration,
}

enum State {
    Waiting {
        signal: Arc<Signal>,
        /// The flag the stream writes, which the future can read itself (`None` for an event).
        flag: Option<FlagRef>,
    },
    /// The outcome, given to every poll from now on.
    Over(Result<()>),
}

impl Done {
    /// A future that fails with `error` at its first poll.
    pub(crate) fn failed(error: Error) -> Done {
        Done {
            state: State::Over(Err(error)),
            spin: Duration::ZERO,
        }
    }

    fn waiting(signal: Arc<Signal>, flag: Option<FlagRef>) -> Done {
        Done {
            state: State::Waiting { signal, flag },
            spin: Duration::ZERO,
        }
    }

    /// A future of `complete`, a query of the driver that is `Ok(true)` once the work has completed, asked
    /// once per round for every future of one `key` (an event's handle).
    fn queried(key: usize, complete: impl FnMut() -> Result<bool> + Send + 'static) -> Done {
        match reactor().watch_query(key, complete) {
            Ok(signal) => Done::waiting(signal, None),
            Err(e) => Done::failed(e),
        }
    }

    /// A future of the work before `mark`, a segment of `stream`'s work (see `marks.rs`). A segment still open
    /// is the stream's current one: closed now, with a flag written right after ([`Stream::done`]). A closed
    /// one has its event, which the reactor queries (its stream may have later work, which a flag would wait
    /// for too).
    pub(crate) fn mark(stream: &Stream, mark: Mark) -> Done {
        if mark.is_complete() {
            return Done::over();
        }
        match mark.event() {
            Some(event) => {
                let key = event.as_raw() as usize;
                // The mark keeps its event.
                Done::queried(key, move || {
                    mark.event().map_or(Ok(true), PooledEvent::query)
                })
            }
            None => stream.done(),
        }
    }

    /// A future that is ready once `deadline` is past: the reactor looks at the clock every query round.
    pub(crate) fn at(deadline: std::time::Instant) -> Done {
        static NEXT_KEY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        // A key no event has (events are addresses, aligned): the answer is this deadline's alone.
        let key = NEXT_KEY.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        Done::queried(key, move || Ok(Instant::now() >= deadline))
    }

    /// A future that is ready at once.
    fn over() -> Done {
        Done {
            state: State::Over(Ok(())),
            spin: Duration::ZERO,
        }
    }

    /// Makes the first poll spin for up to `limit` (reading the completion flag, or the reactor's answer)
    /// before it leaves the waiting to the reactor: the task learns of a completion within a fraction of a
    /// microsecond instead of a reactor's pass and a wake, for as long as it may keep its executor's thread.
    pub fn spin_for(mut self, limit: Duration) -> Done {
        self.spin = limit;
        self
    }
}

impl Future for Done {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        let State::Waiting { signal, flag } = &this.state else {
            let State::Over(outcome) = &this.state else {
                unreachable!()
            };
            return Poll::Ready(outcome.clone());
        };
        let landed = |flag: &Option<FlagRef>| flag.is_some_and(FlagRef::landed);
        let mut outcome = landed(flag).then_some(Ok(()));
        if outcome.is_none() && !this.spin.is_zero() {
            let start = Instant::now();
            while !landed(flag) && !signal.is_finished() && start.elapsed() < this.spin {
                std::hint::spin_loop();
            }
            this.spin = Duration::ZERO;
            outcome = landed(flag).then_some(Ok(()));
        }
        let outcome = match outcome {
            Some(outcome) => outcome,
            None => match signal.poll(cx.waker()) {
                Some(outcome) => outcome,
                None => return Poll::Pending,
            },
        };
        signal.drop_future();
        this.state = State::Over(outcome.clone());
        Poll::Ready(outcome)
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if let State::Waiting { signal, .. } = &self.state {
            signal.drop_future();
        }
    }
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            State::Waiting { flag, .. } => f
                .debug_struct("Done")
                .field("pending", &true)
                .field("flag", &flag.is_some())
                .finish(),
            State::Over(outcome) => f.debug_struct("Done").field("outcome", outcome).finish(),
        }
    }
}

impl Stream {
    /// A future that completes once the work queued on this stream so far has completed (as
    /// [`Stream::synchronize`] returns, without blocking a thread): the stream writes a flag in page-locked
    /// memory after that work (`cuStreamWriteValue32_v2`), which the process's reactor thread watches, or,
    /// where the driver cannot, records an event the reactor queries. The point is taken now, at the call, not
    /// at the first poll: work queued later is not waited for.
    ///
    /// This tells the task when the work is done; it gives no access. Reach buffers through their accessors
    /// (or [`Pinned::readable`](crate::Pinned::readable)), which then find the work complete and do not wait.
    ///
    /// # Errors
    /// The future resolves to the driver's error where queueing the point fails, and to the work's where it
    /// fails (a sticky error of the context).
    #[doc(alias = "cuStreamWriteValue32")]
    #[doc(alias = "cuStreamWriteValue32_v2")]
    pub fn done(&self) -> Done {
        // The point would be captured, and written by every replay instead of now.
        if let Err(e) = self.refuse_in_capture("Stream::done") {
            return Done::failed(e);
        }
        match reactor().watch_stream(self) {
            Ok((signal, flag)) => Done::waiting(signal, flag),
            Err(e) => {
                Done::failed(e.context("queueing a point for a future to wait for on a stream"))
            }
        }
    }
}

impl Event {
    /// A future that completes once the event has (as [`Event::synchronize`] returns, without blocking a
    /// thread): the process's reactor thread queries it. As for the driver's queries, that is the event's
    /// latest record when the reactor looks: recording it again before it completes moves what this waits for,
    /// and an event never recorded is complete.
    ///
    /// # Errors
    /// The future resolves to the driver's error from the query (the work's, such as a sticky error of the
    /// context).
    #[doc(alias = "cuEventQuery")]
    pub fn done(&self) -> Done {
        let event = self.shared();
        Done::queried(event.raw() as usize, move || {
            calls::event_query(event.raw())
        })
    }
}

/// An `async` block's future that answers a poll after it resolved with an `Err` (naming `what`), where the
/// block's own future would panic: the crate's futures never panic on a poll, as [`Done`] and the pool's do not.
pub(crate) struct Resolved<F> {
    /// `None` once it has resolved.
    inner: Option<Pin<Box<F>>>,
    what: &'static str,
}

impl<F: Future<Output = Result<T>>, T> Resolved<F> {
    /// `future`, whose poll after it resolved is an `Err` naming `what` (the call that made it).
    pub(crate) fn new(what: &'static str, future: F) -> Resolved<F> {
        Resolved {
            inner: Some(Box::pin(future)),
            what,
        }
    }
}

impl<F: Future<Output = Result<T>>, T> Future for Resolved<F> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<T>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err(Error::invalid(format_args!(
                "a {} future polled after it resolved: it already gave its outcome",
                self.what
            ))));
        };
        let polled = inner.as_mut().poll(cx);
        if polled.is_ready() {
            self.inner = None;
        }
        polled
    }
}

impl Context {
    /// Futures of the work queued so far on every stream the crate knows in this context, through any handle
    /// of it: the streams made or wrapped by the crate, and each handle's stream for frees.
    pub(crate) fn every_stream_done(&self) -> Vec<Done> {
        let KnownStreams { made, released } = self.known_streams();
        let borrowed = released
            .iter()
            .map(|(context, raw)| Stream::borrowed(context, *raw));
        made.into_iter()
            .filter_map(Stream::of_queue)
            .chain(borrowed)
            .map(|s| s.done())
            .collect()
    }
}
