//! Tracked work on the real device: a buffer's record of the work in flight on it ([`Track`]), the device as
//! its tracker sees it ([`Gpu`]: marks of streams, waits through pooled events; see `driver/marks.rs`), and how
//! the crate's operations enqueue work between the tracker's waits and records ([`Stream::tracked`]).

use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::driver::calls;
use crate::driver::context::Enqueue;
use crate::driver::marks::Mark;
use crate::driver::{Category, Stream};
use crate::error::Result;
use crate::track::{Access, Timeline, Tracker};

/// The tracker of a buffer on the real device.
pub(crate) type GpuTracker = Tracker<Stream, Mark>;

/// A buffer's record of the work in flight on it, shared by the buffer and its views. (`pub` only so that the
/// sealed copy traits can name it; the module is private, so users cannot.)
#[derive(Default)]
pub struct Track(Mutex<GpuTracker>);

impl std::fmt::Debug for Track {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Track")
    }
}

/// Locks a buffer's tracker. A panic while it was held (only possible from a bug in the tracker) leaves the
/// state conservative, so the lock is taken over rather than propagated.
pub(crate) fn lock(track: &Track) -> MutexGuard<'_, GpuTracker> {
    track.0.lock().unwrap_or_else(PoisonError::into_inner)
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
    type Mark = Mark;
    type Error = crate::error::Error;

    fn wait(&self, stream: &Stream, on: &Stream, mark: &Mark) -> Result<()> {
        // No stream query first: a wait for an event that has completed costs the device nothing, and the
        // query would cost the host as much as the record it might save.
        let Some(event) = on.event_of(mark, false)? else {
            return Ok(());
        };
        calls::stream_wait_event(stream.as_raw(), event.as_raw())
            .map_err(|e| e.context("making a stream wait for another stream's work"))
    }

    fn is_complete(&self, on: &Stream, mark: &Mark) -> Result<bool> {
        let Some(event) = on.event_of(mark, true)? else {
            return Ok(true);
        };
        let complete = event.query()?;
        if complete {
            mark.set_complete();
        }
        Ok(complete)
    }

    fn synchronize(&self, on: &Stream, mark: &Mark) -> Result<()> {
        let Some(event) = on.event_of(mark, true)? else {
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
        // One allocation read and written (two views of it) is a write: lock it once.
        let read = read.filter(|r| !write.is_some_and(|w| std::ptr::eq(*r, w)));
        // The written buffer is borrowed exclusively, so no other thread locks it: taking it first cannot
        // deadlock with a thread that holds the read one.
        let mut write = write.map(lock);
        let mut read = read.map(lock);
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
        let mark = segment.mark();
        if let Some(r) = read.as_mut() {
            r.record_use(self, &mark, Access::Read);
        }
        if let Some(w) = write.as_mut() {
            w.record_use(self, &mark, Access::Write);
        }
        enqueued
    }
}

/// How many buffers an enqueue tracks without allocating: nearly every one.
pub(crate) const INLINE: usize = 16;

/// The trackers of a piece of work's buffers, locked (see [`Locked::lock`]), each with how the work uses it.
struct Locked<'t>(SmallVec<[(MutexGuard<'t, GpuTracker>, Access); INLINE]>);

impl<'t> Locked<'t> {
    /// Locks the trackers of `uses` (none locked yet) in address order, one per allocation (where one appears
    /// several times, through views, it counts as written if any use writes it): two threads locking the same
    /// trackers cannot deadlock, and every tracker of a write is borrowed exclusively, so no other thread holds
    /// its lock. Sorts `uses` in place.
    fn lock(&mut self, uses: &mut [(&'t Track, Access)]) {
        let address = |track: &Track| std::ptr::from_ref(track) as usize;
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
            if i > 0 && std::ptr::eq(uses[i - 1].0, track) {
                continue;
            }
            let written = uses[i..]
                .iter()
                .take_while(|(t, _)| std::ptr::eq(*t, track))
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
        self.tracked_uses_holding(self.context().enqueue()?, work, uses, enqueue)
    }

    /// [`Stream::tracked_uses`] for a caller that chose what the work holds while it is queued (as
    /// [`Stream::tracked_holding`]; a launch through `cuLaunchKernel` needs only the gate:
    /// [`Context::enqueue_launch`]).
    ///
    /// [`Context::enqueue_launch`]: crate::driver::Context::enqueue_launch
    pub(crate) fn tracked_uses_holding<R>(
        &self,
        _held: Enqueue<'_>,
        work: Work,
        uses: &mut [(&Track, Access)],
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
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
        let mark = segment.mark();
        for (tracker, access) in locked.iter_mut() {
            tracker.record_use(self, &mark, *access);
        }
        enqueued
    }

    /// Runs `enqueue`, a user's code that enqueues work on this stream using the buffers of `uses`, between
    /// the waits for conflicting work and the record of the uses, as [`Stream::tracked_uses`] does, but with no
    /// lock of the crate held while it runs (it may call the crate, and block), only the device's gate for
    /// reading. That is sound because the uses borrow their buffers: nobody writes a declared buffer meanwhile
    /// and nobody frees one. The uses are recorded at the stream's end after `enqueue` returns (possibly later
    /// than the work itself: never earlier), and also if it unwinds, so that work it enqueued before a panic is
    /// still waited for.
    pub(crate) fn declared<R>(
        &self,
        uses: &mut [(&Track, Access)],
        enqueue: impl FnOnce() -> R,
    ) -> Result<R> {
        let _enqueue = self.context().enqueue()?;
        {
            let mut locked = Locked(SmallVec::new());
            locked.lock(uses);
            for (tracker, access) in locked.iter_mut() {
                tracker.prepare(&Gpu, self, *access)?;
            }
            // The crate's earlier work on this stream keeps an event of its own, not delayed by what follows.
            self.close_segment()?;
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(enqueue));
        {
            let mut locked = Locked(SmallVec::new());
            locked.lock(uses);
            let segment = self.segment();
            let mark = segment.mark();
            for (tracker, access) in locked.iter_mut() {
                tracker.record_use(self, &mark, *access);
            }
        }
        match ran {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
