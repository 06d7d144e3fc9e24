//! The enqueue protocol: how every operation of the crate (a copy, a launch, foreign work, a free) enqueues
//! work on a stream between its buffers' trackers' waits and records. The trackers are locked in one order,
//! the work waits on the device for the conflicting uses of other streams, is enqueued with the stream's
//! context current (under the device's gate), and is recorded even if the enqueue failed partway; in a capture
//! of the crate's, the capture's recording takes the uses instead.

use std::sync::MutexGuard;

use smallvec::SmallVec;

use super::captured::{How, Recording};
use super::tracked::{Gpu, GpuTracker, Track, Work, lock};
use crate::driver::context::Enqueue;
use crate::driver::marks::{Launches, Point};
use crate::driver::{Capture, Category, Stream};
use crate::error::Result;
use crate::track::Access;

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
