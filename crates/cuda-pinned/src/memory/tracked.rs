//! Tracked work on the real device: a buffer's record of the work in flight on it ([`Track`]), and the device as
//! its tracker sees it ([`Gpu`]: marks of streams, waits through pooled events; see `driver/marks.rs`). How the
//! crate's operations enqueue work between the trackers' waits and records is `enqueue.rs`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::driver::calls;
use crate::driver::marks::Point;
use crate::driver::{Category, Stream};
use crate::error::Result;
use crate::track::{Access, Timeline, Tracker};

/// The tracker of a buffer on the real device.
pub(crate) type GpuTracker = Tracker<Stream, Point>;

/// A buffer's record of the work in flight on it, shared by the buffer, its views and the graphs that use it
/// (see `graph.rs`). (`pub` only so that the sealed copy traits can name it; the module is private, so users
/// cannot.)
#[derive(Default)]
pub struct Track(Arc<Shared>);

#[derive(Default)]
struct Shared {
    tracker: Mutex<GpuTracker>,
    /// Bumped each time the tracker is locked while a graph holds the buffer: a graph's launch that finds the
    /// count where its previous launch left it knows that nothing has looked at the buffer since
    /// (`Stream::tracked_launch`).
    version: AtomicU64,
    /// The graphs (and captures in progress) that use the allocation; changed under `orphan`'s lock.
    graphs: AtomicUsize,
    /// Other code's work declared on the buffer, reading and writing it, whose closure is running
    /// (`Stream::declared`): recorded only once it returns, so a graph's launch that conflicts with it is
    /// refused meanwhile. Changed under the tracker's lock.
    declaring: [AtomicUsize; 2],
    /// Whether the allocation is host memory (the host reaches it through accessors).
    host: bool,
    /// The release of the allocation, handed over by its owner's drop while graphs still held it: run when the
    /// last of them lets go (the crate's rule "A graph owns what it uses").
    orphan: Mutex<Option<Orphan>>,
}

/// An allocation's release, deferred by [`Track::adopt`].
pub(crate) type Orphan = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for Track {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Track")
    }
}

impl Track {
    /// The record of host memory, which the host reaches through accessors.
    pub(crate) fn for_host() -> Track {
        Track(Arc::new(Shared {
            host: true,
            ..Shared::default()
        }))
    }

    /// Another handle of the same record: the same key, the same tracker. It holds nothing alive by itself.
    pub(crate) fn share(&self) -> Track {
        Track(Arc::clone(&self.0))
    }

    /// Tells the allocation apart from every other live one (the record's address): the order trackers are
    /// locked in.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// How many times the tracker has been locked while a graph held the buffer.
    pub(crate) fn version(&self) -> u64 {
        self.0.version.load(Ordering::Acquire)
    }

    /// Counts declared work of `access` whose closure runs from now on (`Stream::declared`), or (`ended`) no
    /// longer runs. Call it under the tracker's lock.
    pub(super) fn declaring(&self, access: Access, ended: bool) {
        let count = &self.0.declaring[usize::from(access == Access::Write)];
        if ended {
            count.fetch_sub(1, Ordering::AcqRel);
        } else {
            count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether declared work whose closure is running conflicts with a use of `access`: its use is not recorded
    /// yet. Ask it under the tracker's lock.
    pub(super) fn declared_conflict(&self, access: Access) -> bool {
        let [reading, writing] = &self.0.declaring;
        writing.load(Ordering::Acquire) > 0
            || (access == Access::Write && reading.load(Ordering::Acquire) > 0)
    }

    fn orphan(&self) -> MutexGuard<'_, Option<Orphan>> {
        self.0.orphan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a graph (or a capture in progress) uses the allocation: its owner must not release it, nor hand
    /// it out ([`Track::adopt`] takes the release instead), nor lend it to the host (the graph does).
    pub(crate) fn is_held(&self) -> bool {
        self.0.graphs.load(Ordering::Acquire) > 0
    }

    /// Counts a graph (or a capture) that uses the allocation, until [`Track::let_go`]. Host memory is held by
    /// one at a time (the graph that holds it lends it to the host): `false`, with nothing counted, where another
    /// holds it already.
    #[must_use]
    pub(crate) fn hold(&self) -> bool {
        let _orphan = self.orphan();
        if self.0.host && self.is_held() {
            return false;
        }
        self.0.graphs.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Ends a [`Track::hold`]; where it was the last and the owner has gone, runs the release it left.
    pub(crate) fn let_go(&self) {
        let release = {
            let mut orphan = self.orphan();
            if self.0.graphs.fetch_sub(1, Ordering::AcqRel) == 1 {
                orphan.take()
            } else {
                None
            }
        };
        if let Some(release) = release {
            release();
        }
    }

    /// Takes over `release` (the allocation's, from its owner's drop) while a graph holds the allocation, to run
    /// when the last lets go; hands it back where none holds it any more (the caller runs it then).
    #[must_use]
    pub(crate) fn adopt(&self, release: Orphan) -> Option<Orphan> {
        let mut orphan = self.orphan();
        if !self.is_held() {
            return Some(release);
        }
        debug_assert!(orphan.is_none(), "an allocation has one owner");
        *orphan = Some(release);
        None
    }
}

/// Runs `release` (an allocation's, from its owner's drop) with the work still in flight on `track` taken out:
/// now, or once the last graph that holds the allocation lets go of it, after its replays (the crate's rule
/// "A graph owns what it uses").
pub(crate) fn release_after_graphs(
    track: &Track,
    release: impl FnOnce(GpuTracker) + Send + 'static,
) {
    if !track.is_held() {
        release(std::mem::take(&mut *lock(track)));
        return;
    }
    let shared = track.share();
    let deferred: Orphan = Box::new(move || release(std::mem::take(&mut *lock(&shared))));
    if let Some(now) = track.adopt(deferred) {
        now();
    }
}

/// Fails where a graph holds the allocation: `what` would hand it out (or free it) while the graph may still
/// use it.
///
/// # Errors
/// An invalid-argument error naming `what`.
pub(crate) fn refuse_if_held(track: &Track, what: &str) -> Result<()> {
    if track.is_held() {
        return Err(crate::error::Error::invalid(format_args!(
            "{what}: a graph uses this memory and may still be launched; drop the graph first"
        )));
    }
    Ok(())
}

/// Locks a buffer's tracker. A panic while it was held (only possible from a bug in the tracker) leaves the
/// state conservative, so the lock is taken over rather than propagated.
pub(crate) fn lock(track: &Track) -> MutexGuard<'_, GpuTracker> {
    let tracker = peek(track);
    // Counted only while a graph holds the buffer, the one time anyone reads the count (a graph's launch, whose
    // buffers stay held while it lives): every other lock saves the increment. A lock that finds no hold comes
    // before the capture that took it, which a graph's first launch, down the full path, follows anyway.
    if track.0.graphs.load(Ordering::Acquire) > 0 {
        track.0.version.fetch_add(1, Ordering::AcqRel);
    }
    tracker
}

/// Locks a buffer's tracker without counting a version (see [`lock`]): for a caller that only reads the entries
/// and changes nothing, at a time no launch of a graph can be queued (see `wait_lent`).
pub(crate) fn peek(track: &Track) -> MutexGuard<'_, GpuTracker> {
    track
        .0
        .tracker
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// What a tracked operation is, for the stream's observer (its ledger).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Work {
    /// Timed as `category`, named (empty for none), moving `bytes`.
    Timed(Category, &'static str, usize),
    /// Not timed: bookkeeping that enqueues no work of its own.
    Untimed,
}

/// The real device, as the tracker sees it: marks of [`Stream`]s, waits on the device through pooled events.
pub(crate) struct Gpu;

impl Timeline for Gpu {
    type Stream = Stream;
    type Mark = Point;
    type Error = crate::error::Error;

    fn wait(&self, stream: &Stream, on: &Stream, point: &Point) -> Result<()> {
        // No stream query first: a wait for an event that has completed costs the device nothing, and the
        // query would cost the host as much as the record it might save.
        let mark = point.segment();
        let Some(event) = on.event_of(&mark, false)? else {
            return Ok(());
        };
        calls::stream_wait_event(stream.as_raw(), event.as_raw())
            .map_err(|e| e.context("making a stream wait for another stream's work"))
    }

    fn is_complete(&self, on: &Stream, point: &Point) -> Result<bool> {
        let mark = point.segment();
        let Some(event) = on.event_of(&mark, true)? else {
            return Ok(true);
        };
        let complete = event.query()?;
        if complete {
            mark.set_complete();
        }
        Ok(complete)
    }

    fn synchronize(&self, on: &Stream, point: &Point) -> Result<()> {
        let mark = point.segment();
        let Some(event) = on.event_of(&mark, true)? else {
            return Ok(());
        };
        event.synchronize()?;
        mark.set_complete();
        Ok(())
    }
}
