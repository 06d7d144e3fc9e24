//! CUDA streams: queues of device work that run in order, concurrently with other streams.

#![allow(unsafe_code)]

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::calls;
use super::context::{Context, Queue};
use super::event::Event;
use super::marks::{Mark, PooledEvent, SegmentGuard, SegmentLock};
use crate::error::{Error, Result};
use crate::sys::{CUstream, CUstream_flags};

/// A stream of a context: cheap to clone, and every clone is the same stream.
///
/// Streams are non-blocking: they never synchronise with the legacy default stream (stream 0), which other
/// libraries may use. The stream is destroyed when the last clone drops; buffers with work pending on it keep a
/// clone, so it outlives that work.
///
/// Its methods live with the layer they belong to: making, waiting and querying here; the copies in `copy.rs`
/// and `peer.rs`; staged transfers in `staging/`; launches and foreign work in `launch/enqueue.rs`; futures
/// in `future/done.rs`; the ledger in `profile.rs`; cudarc interop in `interop.rs`; the crate-internal
/// enqueue protocol in `memory/enqueue.rs`.
#[derive(Clone)]
pub struct Stream(Arc<Inner>);

pub(crate) struct Inner {
    raw: CUstream,
    /// Whether the crate created the stream (and destroys it), or borrowed it through `from_raw`.
    owned: bool,
    context: Context,
    /// What the stream's copies and kernels are told to, if anything (opt-in: `with_ledger`).
    observer: Option<Box<dyn WorkObserver>>,
    /// The segment of the stream's work that the crate's next operation joins (see `marks.rs`).
    segment: SegmentLock,
    /// What keeps a borrowed stream alive while this handle lives (another library's stream object).
    _keeps: Option<Box<dyn Any + Send + Sync>>,
    /// Whether the stream is in a capture of the crate's (`graph.rs`): set before the capture begins and
    /// cleared after it ends, so that nothing that would end it (a query, a synchronization, an event recorded
    /// for the tracking) reaches the driver meanwhile.
    capturing: AtomicBool,
    /// The capture, while `capturing`.
    capture: Mutex<Option<Capture>>,
}

/// A capture a stream is in: the thread that records it (the only one whose work on the stream joins it) and
/// its state, which the tracking reaches (`memory/captured.rs`).
#[derive(Clone)]
pub(crate) struct Capture {
    pub(crate) thread: usize,
    pub(crate) state: Arc<dyn Any + Send + Sync>,
}

/// What a ledger entry timed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Category {
    /// Host to device.
    Upload,
    /// Device to host.
    Download,
    /// Device to device.
    DeviceCopy,
    /// A kernel (or other device work wrapped in [`Stream::profile`]).
    #[default]
    Kernel,
}

impl Category {
    /// The category's name in a report.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Category::Upload => "upload",
            Category::Download => "download",
            Category::DeviceCopy => "device copy",
            Category::Kernel => "kernel",
        }
    }

    /// Whether it is a copy.
    pub(crate) fn is_transfer(self) -> bool {
        !matches!(self, Category::Kernel)
    }
}

/// What a stream tells of the work the crate enqueues on it, where it was made with one: the hook that the time
/// ledger implements ([`Stream::with_ledger`]), so that the stream knows nothing of what is done with it.
pub(crate) trait WorkObserver: Any + Send + Sync {
    /// Called on `stream` right before a piece of work is enqueued there; returns what [`WorkObserver::end`]
    /// needs to time it: an event recorded now.
    ///
    /// # Errors
    /// The driver's; the work is not enqueued then.
    fn begin(&self, stream: &Stream) -> Result<Event>;

    /// Called on `stream` right after the work (of `category`, named `name` or `""`, on `bytes`) was enqueued
    /// without error, with what [`WorkObserver::begin`] returned for it.
    ///
    /// # Errors
    /// The driver's.
    fn end(
        &self,
        stream: &Stream,
        start: Event,
        category: Category,
        name: &'static str,
        bytes: usize,
    ) -> Result<()>;
}

// SAFETY: a CUstream is a driver handle usable from any thread; the driver orders and synchronises its use.
unsafe impl Send for Inner {}
// SAFETY: as for Send: enqueueing on one stream from several threads is supported by the driver.
unsafe impl Sync for Inner {}

impl Stream {
    /// A new non-blocking stream of default priority.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuStreamCreate")]
    pub fn new(context: &Context) -> Result<Stream> {
        Stream::create(context, None, None)
    }

    /// A new non-blocking stream with a priority in [`Context::stream_priority_range`] (lower numbers run first
    /// when streams compete); values outside it are clamped by the driver.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuStreamCreateWithPriority")]
    pub fn with_priority(context: &Context, priority: i32) -> Result<Stream> {
        Stream::create(context, Some(priority), None)
    }

    /// A new non-blocking stream of default priority whose copies and kernels are told to `observer`.
    ///
    /// # Errors
    /// The driver's.
    pub(crate) fn with_observer(
        context: &Context,
        observer: Box<dyn WorkObserver>,
    ) -> Result<Stream> {
        Stream::create(context, None, Some(observer))
    }

    fn create(
        context: &Context,
        priority: Option<i32>,
        observer: Option<Box<dyn WorkObserver>>,
    ) -> Result<Stream> {
        let _current = context.enter()?;
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        // The context is current; retired in Inner's Drop.
        let raw = context
            .create_stream(|| match priority {
                Some(priority) => calls::stream_create_with_priority(flags, priority),
                None => calls::stream_create(flags),
            })
            .map_err(|e| e.context("creating a stream"))?;
        Ok(Stream::wrap(Inner {
            raw,
            owned: true,
            context: context.clone(),
            observer,
            segment: SegmentLock::default(),
            _keeps: None,
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
        }))
    }

    /// A stream of `inner`, known to its context (which closes its segments when it synchronizes).
    fn wrap(inner: Inner) -> Stream {
        let stream = Stream(Arc::new(inner));
        stream
            .0
            .context
            .register_stream(Arc::<Inner>::downgrade(&stream.0));
        stream
    }

    /// The stream a context knows as `queue` (every `Queue` is a stream's).
    pub(crate) fn of_queue(queue: Arc<dyn Queue>) -> Option<Stream> {
        let any: Arc<dyn std::any::Any + Send + Sync> = queue;
        any.downcast::<Inner>().ok().map(Stream)
    }

    /// A handle of `raw`, a stream of `context` that the context owns (its release stream), for one use: not
    /// destroyed with the handle, not known to the context's list.
    pub(crate) fn borrowed(context: &Context, raw: CUstream) -> Stream {
        Stream(Arc::new(Inner {
            raw,
            owned: false,
            context: context.clone(),
            observer: None,
            segment: SegmentLock::default(),
            _keeps: None,
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
        }))
    }

    /// What this stream's work is told to, if anything.
    pub(crate) fn observer(&self) -> Option<&dyn WorkObserver> {
        self.0.observer.as_deref()
    }

    /// Runs `work`, which enqueues work of `category` (named `name`, on `bytes`) on this stream, between the
    /// hooks of the stream's observer, if it has one.
    ///
    /// # Errors
    /// `work`'s, or the observer's.
    pub(crate) fn timed<R>(
        &self,
        category: Category,
        name: &'static str,
        bytes: usize,
        work: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let Some(observer) = self.observer() else {
            return work();
        };
        let start = observer.begin(self)?;
        let result = work()?;
        observer.end(self, start, category, name, bytes)?;
        Ok(result)
    }

    /// Wraps a stream made elsewhere (another library, the CUDA runtime). The crate never destroys it.
    ///
    /// Work that other code enqueues on the stream through its handle is invisible to the crate's tracking;
    /// enqueue it through [`Stream::profile`] so that the crate orders its own waits before it.
    ///
    /// # Errors
    /// An invalid-argument error for the null stream and the special handles `CU_STREAM_LEGACY` and
    /// `CU_STREAM_PER_THREAD`: they are not one in-order queue of their own (they synchronize with other
    /// streams, or stand for a different stream on each thread), which the tracking relies on.
    ///
    /// # Safety
    /// `raw` must be a stream of `context`, and stay valid while the returned value or any clone of it lives,
    /// including while buffers that were used on it have work pending (they keep a clone). It must not be a
    /// stream created with `CU_STREAM_DEFAULT` flags that synchronizes with the legacy default stream if other
    /// code uses that stream (its work would then wait for unrelated work there).
    #[doc(alias = "CU_STREAM_LEGACY")]
    #[doc(alias = "CU_STREAM_PER_THREAD")]
    pub unsafe fn from_raw(context: &Context, raw: CUstream) -> Result<Stream> {
        // SAFETY: as the caller guarantees.
        unsafe { Stream::from_raw_keeping(context, raw, None) }
    }

    /// [`Stream::from_raw`], keeping `keeps` (what owns the stream) alive as long as the handle.
    ///
    /// # Safety
    /// As for [`Stream::from_raw`], with "while the returned value lives" guaranteed by `keeps`.
    pub(crate) unsafe fn from_raw_keeping(
        context: &Context,
        raw: CUstream,
        keeps: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<Stream> {
        // cuda.h: CU_STREAM_LEGACY is ((CUstream)0x1), CU_STREAM_PER_THREAD ((CUstream)0x2).
        if (raw as usize) <= 2 {
            return Err(Error::invalid(format_args!(
                "Stream::from_raw: {raw:p} is the null stream, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD, not a \
                 stream of its own; create one (cuStreamCreate with CU_STREAM_NON_BLOCKING) and wrap that"
            )));
        }
        Ok(Stream::wrap(Inner {
            raw,
            owned: false,
            context: context.clone(),
            observer: None,
            segment: SegmentLock::default(),
            _keeps: keeps,
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
        }))
    }

    /// Whether the crate created the stream: it stays visible to the release thread until its work is done,
    /// even after its last handle drops (see [`Context::retire_stream`]).
    pub(crate) fn is_owned(&self) -> bool {
        self.0.owned
    }

    /// The driver's handle, valid while any clone of this stream lives.
    ///
    /// Capture the stream through [`Graph::capture`](crate::Graph::capture): a capture begun on the handle
    /// is left alone by the crate's release thread, but the crate's own work on the stream meanwhile would land
    /// in it, or end it.
    #[must_use]
    pub fn as_raw(&self) -> CUstream {
        self.0.raw
    }

    /// The context the stream belongs to.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// Blocks until all work enqueued on the stream has completed.
    ///
    /// # Errors
    /// The driver's, including errors of the work on the stream.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("Stream::synchronize")?;
        // Work other code enqueues later must not delay what the crate's buffers wait for on this stream. A
        // failure to close only makes later waits less precise: the synchronization still happens.
        let closed = self.close_segment();
        calls::stream_synchronize(self.0.raw).map_err(|e| e.context("synchronising a stream"))?;
        closed
    }

    /// Whether all work enqueued on the stream has completed, without blocking.
    ///
    /// # Errors
    /// The driver's, other than `CUDA_ERROR_NOT_READY` (which is `Ok(false)`).
    #[doc(alias = "cuStreamQuery")]
    pub fn query(&self) -> Result<bool> {
        // Under the segment lock, which a capture takes to begin: a query of a capturing stream would end it.
        let _segment = self.segment();
        self.refuse_in_capture("Stream::query")?;
        calls::stream_query(self.0.raw).map_err(|e| e.context("querying a stream"))
    }

    /// Makes work enqueued on this stream from now on wait, on the device, until `event` has completed. Returns
    /// at once: the host never blocks.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuStreamWaitEvent")]
    pub fn wait(&self, event: &Event) -> Result<()> {
        // A capturing stream may wait only for work of its capture, which the tracking orders itself.
        self.refuse_in_capture("Stream::wait")?;
        // The wait delays everything after it: kept out of the segments of the crate's work, so that no wait
        // for a buffer includes it.
        self.untracked(|| {
            calls::stream_wait_event(self.0.raw, event.as_raw())
                .map_err(|e| e.context("making a stream wait for an event"))
        })
    }

    /// Records `event` at the current end of this stream's work: `event.record(self)`.
    ///
    /// # Errors
    /// As [`Event::record`].
    pub fn record(&self, event: &Event) -> Result<()> {
        event.record(self)
    }

    /// The stream's priority.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuStreamGetPriority")]
    pub fn priority(&self) -> Result<i32> {
        calls::stream_priority(self.0.raw).map_err(|e| e.context("reading a stream's priority"))
    }
}

/// The stream's side of captures (see `graph.rs`).
impl Stream {
    /// Whether the stream is in a capture of the crate's.
    pub(crate) fn is_capturing(&self) -> bool {
        self.0.capturing.load(Ordering::Acquire)
    }

    /// The capture the stream is in, if the calling thread records it; `None` where the stream is not in one.
    ///
    /// # Errors
    /// An invalid-argument error where another thread records the capture: its work would land in that
    /// thread's graph.
    pub(crate) fn capture(&self) -> Result<Option<Capture>> {
        if !self.is_capturing() {
            return Ok(None);
        }
        let capture = self
            .0
            .capture
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match capture {
            Some(c) if c.thread == crate::sync::primitives::this_thread() => Ok(Some(c)),
            // Ended meanwhile: the stream runs work again.
            None => Ok(None),
            Some(_) => Err(Error::invalid(format_args!(
                "{self:?} is capturing a graph on another thread: work queued on it now would join that graph; \
                 nothing was enqueued"
            ))),
        }
    }

    /// Fails if the stream is in a capture: for what cannot be captured, or would end the capture.
    ///
    /// # Errors
    /// An invalid-argument error naming `what`.
    pub(crate) fn refuse_in_capture(&self, what: &str) -> Result<()> {
        if self.is_capturing() {
            return Err(Error::invalid(format_args!(
                "{what}: {self:?} is capturing a graph, which this cannot be part of (it would end the capture, \
                 or stand for nothing in it); call it before or after the capture; nothing was enqueued"
            )));
        }
        Ok(())
    }

    /// Marks the stream as in `capture` (before the driver's capture begins), or as out of one (`None`, after
    /// it has ended).
    pub(crate) fn set_capture(&self, capture: Option<Capture>) {
        let on = capture.is_some();
        *self
            .0
            .capture
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = capture;
        self.0.capturing.store(on, Ordering::Release);
    }
}

/// The stream's side of marks (see `marks.rs`). Lock order: a buffer's tracker, then one stream's segment lock
/// at a time (a thread may take a lock it holds again, see [`SegmentLock`]).
impl Stream {
    /// Locks the stream's current segment.
    pub(crate) fn segment(&self) -> SegmentGuard<'_> {
        self.0.segment.lock()
    }

    /// Closes the current segment if any entry holds it (records its event), so that what the caller enqueues
    /// next does not delay that event.
    ///
    /// # Errors
    /// The driver's, from recording the event; nothing is closed then, and the caller must not enqueue.
    pub(crate) fn close_segment(&self) -> Result<()> {
        let guard = self.segment();
        let mut current = guard.current();
        if current.holders() > 0 {
            self.close(&guard, &mut current)?;
        }
        Ok(())
    }

    /// Runs `enqueue`, which enqueues on this stream work the crate does not track (another library's, a
    /// user's kernel, a wait for a user's event), keeping the crate's marks precise around it: the current
    /// segment is closed first, and while `enqueue` runs the stream counts a section open, so that every
    /// operation of the crate on it, from any thread, closes its segment right after its own work (see
    /// [`SegmentLock`]). No lock of the crate is held while `enqueue` runs (it may call the crate, from this
    /// thread or through others, on any stream); only the device's gate for reading, which never makes a
    /// thread wait for a reader ([`Context::close_gate`]), and the stream's context is current
    /// ([`Context::enqueue`]).
    ///
    /// # Errors
    /// The driver's, from closing the segment; `enqueue`'s.
    pub(crate) fn untracked<R>(&self, enqueue: impl FnOnce() -> Result<R>) -> Result<R> {
        let _enqueue = self.context().enqueue()?;
        {
            // The capture mark is read under the segment lock, which a capture takes to begin.
            let segment = self.segment();
            if self.capture()?.is_some() {
                // Captured, not run: no mark of the crate's on this stream is open (`graph.rs` closed them).
                drop(segment);
                return enqueue();
            }
            self.close_segment()?;
            segment.section(true);
        }
        // Ended on the way out, unwinding too.
        let _section = Section(self);
        enqueue()
    }

    /// Starts an operation of the crate on this stream: closes the current segment unless the only entries that
    /// hold it are the `replaced` ones the operation will replace (count them with
    /// `Tracker::replaced_at`), and returns the segment, locked, for the operation's entries to join
    /// ([`SegmentGuard::mark`]). Hold the guard from before the enqueue until the entries are recorded.
    ///
    /// # Errors
    /// The driver's, from recording the event; the caller must not enqueue then.
    pub(crate) fn begin(&self, replaced: impl FnOnce(&Mark) -> usize) -> Result<Begun<'_>> {
        let guard = self.segment();
        // Checked under the segment lock, which a capture holds while it begins: no work of the tracking lands
        // in a capture but through `memory/captured.rs`.
        self.refuse_in_capture("queueing work the crate tracks")?;
        {
            let mut current = guard.current();
            let replaced = replaced(&current);
            if current.holders() > replaced {
                self.close(&guard, &mut current)?;
            }
        }
        Ok(Begun {
            stream: self,
            guard,
        })
    }

    /// The current segment, locked, for the entries of work already queued to join ([`SegmentGuard::mark`]),
    /// closed when dropped as [`Stream::begin`]'s is.
    pub(crate) fn join(&self) -> Begun<'_> {
        Begun {
            stream: self,
            guard: self.segment(),
        }
    }

    /// Records the current segment's event now and starts a new segment (`current` borrowed from `guard`).
    fn close(&self, guard: &SegmentGuard<'_>, current: &mut Mark) -> Result<()> {
        // An event recorded in a capture stands for nothing outside it (ARCHITECTURE.md, "Graphs").
        self.refuse_in_capture("closing a segment of the tracking")?;
        // Only a closed segment has an event, and only `close` sets one, under the segment lock.
        guard.close(current, |reused| match reused {
            Some(event) => {
                event.record_again(self.as_raw())?;
                Ok(event)
            }
            None => PooledEvent::record(self.context(), self.as_raw()),
        })
    }

    /// The event to wait for to see the work before `mark` (a mark of this stream) complete: its segment's,
    /// closing the segment now if it is still the current one; `None` when that work is known complete. With
    /// `query`, an open segment on a stream found idle is complete and needs no event.
    ///
    /// # Errors
    /// The driver's, from querying the stream or recording the event.
    pub(crate) fn event_of<'m>(
        &self,
        mark: &'m Mark,
        query: bool,
    ) -> Result<Option<&'m PooledEvent>> {
        if mark.is_complete() {
            return Ok(None);
        }
        if let Some(event) = mark.event() {
            return Ok(Some(event));
        }
        let guard = self.segment();
        let mut current = guard.current();
        // Closed, or found complete, by another thread since the checks above?
        if mark.is_complete() {
            return Ok(None);
        }
        if let Some(event) = mark.event() {
            return Ok(Some(event));
        }
        if *current != *mark {
            // Every segment but the current one was closed with an event (only `close` starts a new one, after
            // setting it) or found complete, so this cannot happen. Were it to, an event recorded now is late
            // but never early: the work before the mark precedes it.
            debug_assert!(
                false,
                "a segment left open that is not its stream's current one"
            );
            mark.set_event(PooledEvent::record(self.context(), self.as_raw())?);
            return Ok(mark.event());
        }
        if query && self.query()? {
            mark.set_complete();
            *current = Mark::default();
            return Ok(None);
        }
        self.close(&guard, &mut current)?;
        Ok(mark.event())
    }
}

/// An operation of the crate on a stream, begun ([`Stream::begin`]): the stream's segment locked. Where a
/// section of untracked work is open on the stream, the segment is closed when this drops, right after the
/// operation's work, so that untracked work queued next does not delay its event. A failure to close then
/// only makes later waits less precise (the event is recorded later, never early).
pub(crate) struct Begun<'a> {
    stream: &'a Stream,
    guard: SegmentGuard<'a>,
}

impl<'a> std::ops::Deref for Begun<'a> {
    type Target = SegmentGuard<'a>;

    fn deref(&self) -> &SegmentGuard<'a> {
        &self.guard
    }
}

impl<'a> Begun<'a> {
    /// Ends the operation once its entries are recorded: where a section is open, closes the segment now.
    ///
    /// # Errors
    /// The driver's, from recording the segment's event: the operation's work is queued and tracked, and
    /// later waits for it may wait longer than they need (never less).
    pub(crate) fn finish(mut self) -> Result<()> {
        self.end()
    }

    fn end(&mut self) -> Result<()> {
        if self.guard.in_section() {
            let mut current = self.guard.current();
            if current.holders() > 0 {
                return self.stream.close(&self.guard, &mut current);
            }
        }
        Ok(())
    }
}

impl Drop for Begun<'_> {
    /// On the paths that return early (an error before the enqueue), or after [`Begun::finish`] (then
    /// nothing is left to close).
    fn drop(&mut self) {
        let _ = self.end();
    }
}

/// A section of untracked work open on a stream ([`Stream::untracked`]); ends it when dropped.
struct Section<'a>(&'a Stream);

impl Drop for Section<'_> {
    fn drop(&mut self) {
        self.0.segment().section(false);
    }
}

/// The stream as its context sees it (one whose last handle is going is not idle: see
/// [`Context::unregister_stream`]).
impl Queue for Inner {
    fn close_segment(self: Arc<Self>) -> Result<()> {
        Stream(self).close_segment()
    }

    fn query(self: Arc<Self>) -> Result<bool> {
        // A capturing stream runs nothing, and a query would end its capture: busy until the capture ends.
        // Asked under the segment lock, which a capture takes to begin; then the driver is asked, for a capture
        // other code began through the raw handle (asking never ends one).
        let stream = Stream(self);
        let _segment = stream.segment();
        if stream.is_capturing() || calls::stream_is_capturing(stream.as_raw())? {
            return Ok(false);
        }
        calls::stream_query(stream.as_raw()).map_err(|e| e.context("querying a stream"))
    }

    fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }
}

impl Event {
    /// Records the event at the current end of `stream`'s work. Returns at once.
    ///
    /// # Errors
    /// The driver's, such as `CUDA_ERROR_INVALID_HANDLE` for a stream of another context.
    #[doc(alias = "cuEventRecord")]
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // Recorded in a capture, the event would stand for nothing outside it, and its queries would fail.
        stream.refuse_in_capture("Event::record")?;
        calls::event_record(self.as_raw(), stream.as_raw())
            .map_err(|e| e.context("recording an event"))
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:p})", self.0.raw)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Under the device's gate, so that the release thread does not look between the stream's leaving the
        // context's list and its joining the device's list of streams to retire.
        let _gate = self.context.enqueue_gate();
        if self.owned {
            // Created by `new` or `with_priority`, and no clone is left. Destroyed once the work still queued on
            // it has completed, so that the release thread sees that work meanwhile.
            self.context.retire_stream(self.raw);
        }
        self.context
            .unregister_stream(std::ptr::from_ref(self).cast());
    }
}
