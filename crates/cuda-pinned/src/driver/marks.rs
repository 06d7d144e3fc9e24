//! Marks: the points in a stream's work that buffers' trackers wait for, kept precise at the cost of one event
//! record where it is needed. This file holds the segments, their lock and the pooled events; the stream's side
//! (closing segments, finding a mark's event) is in `stream.rs`, and the real device as the tracker sees it
//! (`Gpu`, which waits for marks) in `memory/tracked.rs` (the enqueue protocol that records them: `memory/enqueue.rs`).
//!
//! A stream's work is cut into *segments*. Work the crate enqueues joins the stream's current segment, and
//! the tracker entries it leaves hold that segment as their mark. An event for a segment, when someone has to
//! wait for it, must complete right after the segment's last work: recorded later, behind unrelated work,
//! it would make the waiter wait for that work too (a hidden wait, against the crate's rule "No hidden waits"). So the
//! current segment is *closed*, its event recorded at the stream's end, before anything else is enqueued on
//! the stream while an entry may still need it:
//!
//! - before each operation of the crate on the stream, unless every entry that holds the segment is about to
//!   be replaced by that very operation (the fast path: the same buffers used again on one stream records
//!   nothing, as it did before marks existed);
//! - before work the crate does not track is enqueued through its API ([`Stream::wait`], [`Stream::profile`]);
//! - before the stream or the context is synchronized, so that work enqueued afterwards by other code, which
//!   the crate cannot see, does not delay the segment's event: it completes with the synchronization.
//!
//! Whether an entry may still need the segment is read from the segment's reference count: the stream holds
//! one reference and every entry one more. Entries are created only under the stream's lock, by operations on
//! the stream, so while the lock is held the count can only fall (entries dropped elsewhere), which at worst
//! records an event that turns out unneeded.
//!
//! A graph's launches (`Stream::tracked_launch`) leave entries that hold no segment but the graph's
//! [`Launches`] on the stream: a forwarding point whose segment each launch moves to its own. So a launch that
//! finds the graph's buffers untouched since the previous one touches none of their trackers, whether or not
//! that one's segment has been closed since (by a synchronization, say), and its cost does not grow with the
//! buffers. The graph's hold on its segment counts as one holder.
//!
//! Work enqueued on a stream through its raw handle (`Stream::as_raw`) is invisible: an entry whose segment is
//! still open when such work follows gets an event behind that work. Enqueue other code's work through
//! [`Stream::profile`] to keep marks precise.
//!
//! The events come from a per-context pool: creating and destroying a CUDA event costs more than recording
//! one, and a stream crossing costs one record and one wait.
//!
//! [`Stream::wait`]: crate::Stream::wait
//! [`Stream::profile`]: crate::Stream::profile

#![allow(unsafe_code)]

use std::borrow::Cow;
use std::cell::{Cell, RefCell, RefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use super::calls;
use super::context::Context;
use crate::error::Result;
use crate::sync::reentrant::Reentrant;
use crate::sys::{CUevent, CUstream};

/// A segment of a stream's work (see the module docs). Cheap to clone; equal when it is the same segment.
#[derive(Clone, Default)]
pub(crate) struct Mark(Arc<Segment>);

#[derive(Default)]
struct Segment {
    /// Recorded right after the segment's last work, once the segment is closed.
    event: OnceLock<PooledEvent>,
    /// Seen complete (its event, or the whole stream, found done): nothing to wait for.
    complete: AtomicBool,
}

impl PartialEq for Mark {
    fn eq(&self, other: &Mark) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Mark {}

impl std::fmt::Debug for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mark")
            .field("closed", &self.0.event.get().is_some())
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl Mark {
    /// Whether the segment's work was seen complete: nothing to wait for.
    pub(crate) fn is_complete(&self) -> bool {
        self.0.complete.load(Ordering::Acquire)
    }

    /// Records that the segment's work was seen complete.
    pub(crate) fn set_complete(&self) {
        self.0.complete.store(true, Ordering::Release);
    }

    /// Whether the segment is still open (its stream's current one, or so it was when asked): not closed
    /// with an event, not seen complete.
    pub(crate) fn is_open(&self) -> bool {
        self.event().is_none() && !self.is_complete()
    }

    /// How many tracker entries hold this segment, given that the stream holds it too.
    pub(crate) fn holders(&self) -> usize {
        Arc::strong_count(&self.0) - 1
    }

    /// The segment's event, once it is closed.
    pub(crate) fn event(&self) -> Option<&PooledEvent> {
        self.0.event.get()
    }

    /// Closes the segment with `event`, recorded right after its last work; a segment closed already keeps the
    /// event it has.
    pub(crate) fn set_event(&self, event: PooledEvent) {
        let _ = self.0.event.set(event);
    }
}

/// Where a tracker entry's work ends on its stream: a segment of the stream's work, or a graph's latest launch
/// there ([`Launches`]). Equal when it is the same segment, or the same graph's launches.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Point {
    /// The end of a segment.
    Segment(Mark),
    /// The end of a graph's latest launch on the entry's stream.
    Launches(Launches),
}

impl Point {
    /// The segment this point ends in now: for a graph's launches, the latest one's (read under its lock, so
    /// never half-way through a launch).
    pub(crate) fn segment(&self) -> Cow<'_, Mark> {
        match self {
            Point::Segment(mark) => Cow::Borrowed(mark),
            Point::Launches(launches) => Cow::Owned(launches.latest().clone()),
        }
    }
}

/// A segment entry is replaced by work joining the same segment; a graph's entries only by its own launches,
/// which count its hold themselves (`Stream::tracked_launch`).
impl PartialEq<Mark> for Point {
    fn eq(&self, mark: &Mark) -> bool {
        matches!(self, Point::Segment(own) if own == mark)
    }
}

/// The launches of one graph on one stream, as the trackers of the graph's buffers hold them: the segment of
/// the latest one, which each launch moves to its own under the lock, so that a launch that finds its buffers'
/// trackers untouched since the previous one (`Stream::tracked_launch`) needs to touch none of them: their
/// entries already end wherever the graph's latest launch does. Lock order: a buffer's tracker, then the
/// stream's segment lock, then this; whoever holds it takes no other lock of the tracking but a segment lock
/// it holds already. Cheap to clone; equal when it is the same graph's on the same stream.
#[derive(Clone)]
pub(crate) struct Launches(Arc<Mutex<Mark>>);

impl Launches {
    /// The launches of a graph whose first one (here) joins `segment`.
    pub(crate) fn new(segment: Mark) -> Launches {
        Launches(Arc::new(Mutex::new(segment)))
    }

    /// The segment of the latest launch, locked: a launch moves it, a resolver reads it.
    pub(crate) fn latest(&self) -> MutexGuard<'_, Mark> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PartialEq for Launches {
    fn eq(&self, other: &Launches) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Launches {}

impl std::fmt::Debug for Launches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not locked: a tracker printed under it must not wait.
        write!(f, "Launches({:p})", Arc::as_ptr(&self.0))
    }
}

/// A stream's current segment (what the crate's next operation on it joins), behind a lock that the thread
/// holding it may take again (the crate's own code nests operations). It is held only while the crate's own
/// code runs, never across a user's closure: a section of work the crate does not track
/// ([`Stream::untracked`](super::stream::Stream::untracked)) is counted here instead (`sections`), and while
/// one is open, every operation of the crate on the stream closes its segment right after its work, so that
/// the untracked work around it, from any thread, does not delay that segment's event.
///
/// Every operation of the crate on a stream takes it; the hand-over itself is [`Reentrant`]'s.
#[derive(Default)]
pub(crate) struct SegmentLock {
    lock: Reentrant,
    /// Touched only by the thread that holds the lock, and never borrowed across a call that may take it again.
    current: RefCell<Mark>,
    /// The segments this stream closed last, at most [`RETIRED`], oldest first; as `current`, only under the
    /// lock. One that no entry holds any more is reused by the next close, with its event.
    retired: RefCell<Vec<Mark>>,
    /// How many sections of untracked work are open on the stream, on any thread; as `current`, only under
    /// the lock.
    sections: Cell<usize>,
}

/// How many closed segments a stream keeps for reuse ([`SegmentLock::retired`]). Work alternating between
/// streams leaves a closed segment unheld after two or three operations.
const RETIRED: usize = 4;

// The guard stays on the thread that took the lock (the `unsafe impl Sync` below relies on it).
static_assertions::assert_not_impl_any!(SegmentGuard<'static>: Send, Sync);

// SAFETY: `current`, `retired` and `sections` are only reached by the thread that holds the lock (through a
// `SegmentGuard`, which is not `Send`), and `Reentrant` orders one holder's accesses before the next one's.
unsafe impl Sync for SegmentLock {}

impl SegmentLock {
    /// Takes the lock (again, if this thread holds it).
    pub(crate) fn lock(&self) -> SegmentGuard<'_> {
        self.lock.acquire();
        SegmentGuard {
            lock: self,
            _not_send: std::marker::PhantomData,
        }
    }
}

/// A stream's segment lock held by this thread (see [`SegmentLock`]); neither `Send` nor `Sync`: the lock knows
/// its holder by the thread, and only that thread may reach what it guards.
pub(crate) struct SegmentGuard<'a> {
    lock: &'a SegmentLock,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl SegmentGuard<'_> {
    /// The current segment, for a short use that calls nothing that could take the lock again.
    pub(crate) fn current(&self) -> RefMut<'_, Mark> {
        self.lock.current.borrow_mut()
    }

    /// Closes the current segment (`current`, borrowed from this guard) with an event that `record` records
    /// at the stream's end now, and starts a new one. A segment this stream closed before and that nothing
    /// holds any more is the new one, and its event, if it has one, is recorded again for the closing segment:
    /// no allocation and no trip to the context's event pool. Otherwise `record` is given no event and takes
    /// one from the pool.
    ///
    /// # Errors
    /// `record`'s; the segment is then still open.
    pub(crate) fn close(
        &self,
        current: &mut Mark,
        record: impl FnOnce(Option<PooledEvent>) -> Result<PooledEvent>,
    ) -> Result<()> {
        let mut retired = self.lock.retired.borrow_mut();
        let unheld = retired
            .iter()
            .position(|mark| Arc::strong_count(&mark.0) == 1 && Arc::weak_count(&mark.0) == 0);
        let (next, event) = match unheld.map(|i| retired.remove(i)) {
            Some(mut mark) => {
                let segment = Arc::get_mut(&mut mark.0).expect("held by the list alone");
                let event = segment.event.take();
                *segment.complete.get_mut() = false;
                (mark, event)
            }
            None => (Mark::default(), None),
        };
        current.set_event(record(event)?);
        retired.push(std::mem::replace(current, next));
        if retired.len() > RETIRED {
            retired.remove(0);
        }
        Ok(())
    }

    /// The current segment, for an operation's entries to join (`Tracker::record_use`), for a short use that
    /// calls nothing that could take the lock again.
    pub(crate) fn mark(&self) -> std::cell::Ref<'_, Mark> {
        self.lock.current.borrow()
    }

    /// Counts a section of untracked work as open (`true`) or ended (`false`).
    pub(crate) fn section(&self, open: bool) {
        let sections = self.lock.sections.get();
        self.lock
            .sections
            .set(if open { sections + 1 } else { sections - 1 });
    }

    /// Whether a section of untracked work is open on the stream (on any thread).
    pub(crate) fn in_section(&self) -> bool {
        self.lock.sections.get() > 0
    }
}

impl Drop for SegmentGuard<'_> {
    fn drop(&mut self) {
        self.lock.lock.release();
    }
}

/// An event of a context's pool, recorded without timing; back to the pool when dropped.
pub(crate) struct PooledEvent {
    raw: CUevent,
    context: Context,
}

// SAFETY: a CUevent is a driver handle usable from any thread; the crate only passes it to driver calls.
unsafe impl Send for PooledEvent {}
// SAFETY: as for Send; every use takes `&self` and goes through thread-safe driver calls.
unsafe impl Sync for PooledEvent {}

impl PooledEvent {
    /// An event of `context`, recorded at the end of `stream` (a stream of it) now.
    pub(crate) fn record(context: &Context, stream: CUstream) -> Result<PooledEvent> {
        let event = PooledEvent {
            raw: context.take_event()?,
            context: context.clone(),
        };
        // On failure the event goes back to the pool unrecorded, which is harmless: recording again replaces
        // whatever it held.
        calls::event_record(event.raw, stream)
            .map_err(|e| e.context("recording an event to order work after"))?;
        Ok(event)
    }

    /// Records this event again at the end of `stream` (a stream of its context) now. Waits enqueued for its
    /// earlier record keep waiting for that one, as the driver defines them.
    pub(crate) fn record_again(&self, stream: CUstream) -> Result<()> {
        calls::event_record(self.raw, stream)
            .map_err(|e| e.context("recording an event to order work after"))
    }

    pub(crate) fn as_raw(&self) -> CUevent {
        self.raw
    }

    /// Whether the event has completed, without blocking.
    pub(crate) fn query(&self) -> Result<bool> {
        calls::event_query(self.raw).map_err(|e| e.context("querying whether work has completed"))
    }

    /// Blocks until the event has completed.
    pub(crate) fn synchronize(&self) -> Result<()> {
        calls::event_synchronize(self.raw).map_err(|e| e.context("waiting for work to complete"))
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        self.context.give_event(self.raw);
    }
}
