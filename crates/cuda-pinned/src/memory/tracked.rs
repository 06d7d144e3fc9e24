//! Tracked work on the real device: a buffer's record of the work in flight on it ([`Track`]), the device as
//! its tracker sees it ([`Gpu`]: marks of streams, waits through pooled events; see `driver/marks.rs`), and how
//! the crate's operations enqueue work between the tracker's waits and records ([`Stream::tracked`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::captured::{How, Recording};
use crate::driver::calls;
use crate::driver::context::Enqueue;
use crate::driver::marks::{Launches, Point};
use crate::driver::{Capture, Category, Stream};
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
    fn declaring(&self, access: Access, ended: bool) {
        let count = &self.0.declaring[usize::from(access == Access::Write)];
        if ended {
            count.fetch_sub(1, Ordering::AcqRel);
        } else {
            count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether declared work whose closure is running conflicts with a use of `access`: its use is not recorded
    /// yet. Ask it under the tracker's lock.
    fn declared_conflict(&self, access: Access) -> bool {
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

impl Stream {
    /// Runs `enqueue` between the trackers' `prepare` and `record_use`: the work waits for every conflicting
    /// use on other streams, and is recorded (even if the enqueue failed partway).
    pub(crate) fn tracked(
        &self,
        read: Option<&Track>,
        write: Option<&Track>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.tracked_as(Work::Untimed, read, write, enqueue)
    }

    /// [`Stream::tracked`] for work that the stream's observer (its ledger), if it has one, is told of as `work`.
    pub(crate) fn tracked_as(
        &self,
        work: Work,
        read: Option<&Track>,
        write: Option<&Track>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        // While this work is being queued, the release thread cannot find the device idle (memory/release.rs),
        // and the stream's context is current: the driver takes some copies' context from the thread, not the
        // stream (see `Context::enqueue`).
        self.tracked_holding(self.context().enqueue()?, work, read, write, enqueue)
    }

    /// [`Stream::tracked_as`] for a caller that chose what the work holds while it is queued: the device's gate
    /// always, the stream's context current where the work needs it ([`Context::enqueue`],
    /// [`Context::enqueue_copy`]), held until the uses are recorded.
    ///
    /// [`Context::enqueue`]: crate::driver::Context::enqueue
    /// [`Context::enqueue_copy`]: crate::driver::Context::enqueue_copy
    pub(crate) fn tracked_holding(
        &self,
        _held: Enqueue<'_>,
        work: Work,
        read: Option<&Track>,
        write: Option<&Track>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if let Some(capture) = self.capture()? {
            let uses: SmallVec<[(&Track, Access); 2]> = read
                .map(|r| (r, Access::Read))
                .into_iter()
                .chain(write.map(|w| (w, Access::Write)))
                .collect();
            return in_capture(&capture)?.tracked(self, &uses, How::Crate, enqueue);
        }
        // One allocation read and written (two views of it) is a write: lock it once.
        let read = read.filter(|r| write.is_none_or(|w| r.key() != w.key()));
        // In the order of their keys, as every thread that locks several trackers does (a graph's launch locks
        // those of buffers it does not borrow).
        let (mut write, mut read) = match (write, read) {
            (Some(w), Some(r)) if r.key() < w.key() => {
                let r = lock(r);
                (Some(lock(w)), Some(r))
            }
            (w, r) => (w.map(lock), r.map(lock)),
        };
        if let Some(r) = read.as_mut() {
            r.prepare(&Gpu, self, Access::Read)?;
        }
        if let Some(w) = write.as_mut() {
            w.prepare(&Gpu, self, Access::Write)?;
        }
        // The stream's segment, locked until the uses are recorded; closed first unless this work replaces
        // every entry that holds it (see `driver/marks.rs`).
        let segment = self.begin(|current| {
            read.as_ref()
                .map_or(0, |r| r.replaced_at(self, current, Access::Read))
                + write
                    .as_ref()
                    .map_or(0, |w| w.replaced_at(self, current, Access::Write))
        })?;
        // Recorded even if the enqueue failed: it may have enqueued part of its work (the checksum launcher
        // enqueues a memset, then the kernel), and recording a use that did not happen is only conservative.
        let enqueued = match work {
            Work::Timed(category, name, bytes) => self.timed(category, name, bytes, enqueue),
            Work::Untimed => enqueue(),
        };
        let point = Point::Segment(segment.mark().clone());
        if let Some(r) = read.as_mut() {
            r.record_use(self, &point, Access::Read);
        }
        if let Some(w) = write.as_mut() {
            w.record_use(self, &point, Access::Write);
        }
        let finished = segment.finish();
        enqueued.and(finished)
    }
}

/// How many buffers an enqueue tracks without allocating: nearly every one.
pub(crate) const INLINE: usize = 16;

/// The trackers of a piece of work's buffers, locked (see [`Locked::lock`]), each with how the work uses it.
struct Locked<'t>(SmallVec<[(MutexGuard<'t, GpuTracker>, Access); INLINE]>);

impl<'t> Locked<'t> {
    /// Locks the trackers of `uses` (none locked yet) in the order of their keys, one per allocation (where one
    /// appears several times, through views, it counts as written if any use writes it): two threads locking
    /// the same trackers cannot deadlock. Sorts `uses` in place.
    fn lock(&mut self, uses: &mut [(&'t Track, Access)]) {
        let address = |track: &Track| track.key();
        if uses.len() > INLINE {
            uses.sort_unstable_by_key(|&(track, _)| address(track));
        } else {
            // A few elements: insertion sort, without the general sort's set-up.
            for i in 1..uses.len() {
                let mut j = i;
                while j > 0 && address(uses[j - 1].0) > address(uses[j].0) {
                    uses.swap(j - 1, j);
                    j -= 1;
                }
            }
        }
        for (i, &(track, access)) in uses.iter().enumerate() {
            if i > 0 && uses[i - 1].0.key() == track.key() {
                continue;
            }
            let written = uses[i..]
                .iter()
                .take_while(|(t, _)| t.key() == track.key())
                .any(|&(_, a)| a == Access::Write);
            self.0
                .push((lock(track), if written { Access::Write } else { access }));
        }
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut (MutexGuard<'t, GpuTracker>, Access)> {
        self.0.iter_mut()
    }
}

impl Stream {
    /// [`Stream::tracked_as`] for work that uses any number of buffers, each read or written (`uses`, sorted in
    /// place). `enqueue` is the crate's own code and runs with the trackers and the stream's segment locked.
    pub(crate) fn tracked_uses<R>(
        &self,
        work: Work,
        uses: &mut [(&Track, Access)],
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        self.tracked_uses_holding(self.context().enqueue()?, work, uses, None, enqueue)
    }

    /// [`Stream::tracked_uses`] for a caller that chose what the work holds while it is queued (as
    /// [`Stream::tracked_holding`]; a launch through `cuLaunchKernel` needs only the gate:
    /// [`Context::enqueue_launch`]). `kernel`: the work is one kernel launch, and this is what each of its
    /// parameters is (the key of the buffer it points to, or `None` for a value), for a capture to keep.
    ///
    /// [`Context::enqueue_launch`]: crate::driver::Context::enqueue_launch
    pub(crate) fn tracked_uses_holding<R>(
        &self,
        _held: Enqueue<'_>,
        work: Work,
        uses: &mut [(&Track, Access)],
        kernel: Option<&[Option<usize>]>,
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if let Some(capture) = self.capture()? {
            let how = kernel.map_or(How::Crate, How::Kernel);
            return in_capture(&capture)?.tracked(self, uses, how, enqueue);
        }
        let mut locked = Locked(SmallVec::new());
        locked.lock(uses);
        for (tracker, access) in locked.iter_mut() {
            tracker.prepare(&Gpu, self, *access)?;
        }
        let segment = self.begin(|current| {
            locked
                .iter_mut()
                .map(|(tracker, access)| tracker.replaced_at(self, current, *access))
                .sum()
        })?;
        // Recorded even if the enqueue failed, as in `tracked_as`.
        let enqueued = match work {
            Work::Timed(category, name, bytes) => self.timed(category, name, bytes, enqueue),
            Work::Untimed => enqueue(),
        };
        let point = Point::Segment(segment.mark().clone());
        for (tracker, access) in locked.iter_mut() {
            tracker.record_use(self, &point, *access);
        }
        let finished = segment.finish();
        enqueued.and_then(|value| finished.map(|()| value))
    }

    /// Runs `enqueue`, a user's code that enqueues work on this stream using the buffers of `uses`, between
    /// the waits for conflicting work and the record of the uses, as [`Stream::tracked_uses`] does, but with no
    /// lock of the crate held while it runs (it may call the crate, and block), only the device's gate for
    /// reading. That is sound because the uses borrow their buffers: nobody writes a declared buffer meanwhile
    /// and nobody frees one, but for a graph's launch, which uses its buffers without borrowing them: the
    /// buffers count the closure as running (`Track::declaring`), and a launch that would conflict with it is
    /// refused until it has returned (`Stream::tracked_launch`). The uses are recorded at the stream's end after
    /// `enqueue` returns (possibly later than the work itself: never earlier), and also if it unwinds, so that
    /// work it enqueued before a panic is still waited for.
    pub(crate) fn declared<R>(
        &self,
        uses: &mut [(&Track, Access)],
        enqueue: impl FnOnce() -> R,
    ) -> Result<R> {
        let _enqueue = self.context().enqueue()?;
        if let Some(capture) = self.capture()? {
            return in_capture(&capture)?.tracked(self, uses, How::Declared, || {
                // Captured, not run; a panic unwinds out of the capture, which its owner then ends.
                Ok(enqueue())
            });
        }
        {
            let mut locked = Locked(SmallVec::new());
            locked.lock(uses);
            for (tracker, access) in locked.iter_mut() {
                tracker.prepare(&Gpu, self, *access)?;
            }
            // The crate's earlier work on this stream keeps an event of its own, not delayed by what follows.
            self.close_segment()?;
            // A graph's launch, which uses the buffers without borrowing them, is refused until the uses are
            // recorded below.
            for (track, access) in uses.iter() {
                track.declaring(*access, false);
            }
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(enqueue));
        let finished = {
            let mut locked = Locked(SmallVec::new());
            locked.lock(uses);
            let segment = self.join();
            let point = Point::Segment(segment.mark().clone());
            for (tracker, access) in locked.iter_mut() {
                tracker.record_use(self, &point, *access);
            }
            for (track, access) in uses.iter() {
                track.declaring(*access, true);
            }
            segment.finish()
        };
        match ran {
            Ok(value) => finished.map(|()| value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Where a graph's last launch left its buffers (`Stream::tracked_launch`): the stream it was on, the graph's
/// launches there as its buffers' entries hold them, and each buffer's tracker version right after its use was
/// recorded.
pub(crate) struct Launched {
    stream: Stream,
    launches: Launches,
    versions: Vec<u64>,
}

impl Stream {
    /// A graph's launch: `enqueue` queues it on this stream, tracked as one piece of work that uses `uses`
    /// (one per allocation, in the order of their keys), as [`Stream::tracked_uses`] does, with `last` what
    /// the graph's previous launch left.
    ///
    /// The entries a launch records end at the graph's [`Launches`] on the stream, not at a segment. Where the
    /// previous launch was on this stream and no buffer's tracker has been locked since (the versions), those
    /// entries already say what this launch needs, once the launches' segment is moved to the stream's current
    /// one, which this launch joins (closed first where other work's entries hold it, as `begin` does for any
    /// operation): so it touches no tracker, and its cost does not grow with the buffers, whether or not the
    /// previous launch's segment has been closed since (by a synchronization, say).
    ///
    /// Why that is sound: whoever changes or resolves an entry first locks its tracker, which changes the
    /// version. Work on this stream replaces an entry under this stream's segment lock, which the launch holds
    /// from the look at the versions until it has queued: either the look sees the new version, or that work
    /// comes after the launch. A resolver on another stream reads the segment of the launches under their
    /// lock, which the launch holds from the look until it has moved the segment to the current one: either
    /// the look sees the new version, or the resolver sees the current segment, whose event (recorded under
    /// the segment lock, so after the launch) it waits for. Otherwise every tracker is locked, waited for and
    /// recorded.
    pub(crate) fn tracked_launch(
        &self,
        uses: &[(Track, Access)],
        last: &mut Option<Launched>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let _enqueue = self.context().enqueue()?;
        let previous = last.take().filter(|l| l.stream == *self);
        if let Some(same) = previous.as_ref() {
            let segment = self.segment();
            let mut latest = same.launches.latest();
            let unchanged = uses
                .iter()
                .zip(&same.versions)
                .all(|((track, _), &version)| track.version() == version);
            if unchanged {
                // Closed first where other entries hold the current segment (work queued since the last
                // launch), so that their event comes before this launch, as for any operation.
                let segment = self.begin(|current| usize::from(*latest == *current))?;
                {
                    let current = segment.mark();
                    if *latest != *current {
                        *latest = current.clone();
                    }
                }
                drop(latest);
                let enqueued = self.timed(Category::Kernel, "graph", 0, enqueue);
                let finished = segment.finish();
                *last = previous;
                return enqueued.and(finished);
            }
            drop(latest);
            drop(segment);
        }
        let mut trackers: Vec<MutexGuard<'_, GpuTracker>> =
            uses.iter().map(|(track, _)| lock(track)).collect();
        if uses
            .iter()
            .any(|(track, access)| track.declared_conflict(*access))
        {
            // Other code's work declared on a buffer (`enqueue_foreign`), whose closure is still running: its
            // place on its stream is not known until the closure returns, and its use, recorded then, would
            // replace this launch's without having waited for it. Refused, not waited for: the closure may be
            // this thread's, or wait for something this thread holds.
            return Err(crate::error::Error::invalid(
                "Graph::launch: a buffer the graph uses is declared by other code's work whose closure is still \
                 running (Stream::enqueue_foreign, on this thread or another): its place on its stream is not \
                 known yet; launch once that call has returned; nothing was enqueued",
            ));
        }
        for (tracker, (_, access)) in trackers.iter_mut().zip(uses) {
            tracker.prepare(&Gpu, self, *access)?;
        }
        let launches = previous.map(|l| l.launches);
        let segment = self.begin(|current| {
            // The graph's hold on the segment, if its latest launch here joined it, goes with this launch too.
            let graph = launches
                .as_ref()
                .is_some_and(|launches| *launches.latest() == *current);
            trackers
                .iter()
                .zip(uses)
                .map(|(tracker, (_, access))| tracker.replaced_at(self, current, *access))
                .sum::<usize>()
                + usize::from(graph)
        })?;
        // Recorded even if the enqueue failed, as in `tracked_as`.
        let enqueued = self.timed(Category::Kernel, "graph", 0, enqueue);
        let launches = match launches {
            Some(launches) => {
                *launches.latest() = segment.mark().clone();
                launches
            }
            None => Launches::new(segment.mark().clone()),
        };
        let point = Point::Launches(launches.clone());
        for (tracker, (_, access)) in trackers.iter_mut().zip(uses) {
            tracker.record_use(self, &point, *access);
        }
        if enqueued.is_ok() {
            *last = Some(Launched {
                stream: self.clone(),
                launches,
                versions: uses.iter().map(|(track, _)| track.version()).collect(),
            });
        }
        let finished = segment.finish();
        enqueued.and(finished)
    }
}

/// The recording of `capture` (`captured.rs`).
fn in_capture(capture: &Capture) -> Result<&Recording> {
    Recording::of(&capture.state).ok_or_else(|| {
        crate::error::Error::invalid("a stream is in a capture the crate does not know")
    })
}
