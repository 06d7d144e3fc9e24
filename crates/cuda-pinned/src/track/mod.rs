//! The device work in flight on one buffer, as a pure state machine (the crate's rules "Work is recorded", "Waits are on the device" and "Release after completion").
//!
//! A [`Tracker`] records the last device write to a buffer and the device reads since, each as an entry: the
//! stream the work was enqueued on and a *mark*, the point in that stream's work right after it. Before work on
//! stream `S` uses the buffer, [`Tracker::prepare`] makes `S` wait on the device for every conflicting entry of
//! another stream; after the work is enqueued, [`Tracker::record_use`] adds it. The host side
//! ([`Tracker::host_wait`], [`Tracker::try_host`]) and release ([`Tracker::is_idle`], [`Tracker::order_before`],
//! [`Tracker::synchronize_all`]) wait for or query the same entries. Everything device-specific goes through the
//! [`Timeline`] trait, so this module has no FFI and is tested on the CPU against a simulated device.
//!
//! A mark costs nothing to take: no event is recorded when work is enqueued, because most work on a buffer stays
//! on one stream, where stream order alone is enough. The [`Timeline`] turns a mark into something to wait for
//! only when another stream or the host first has to, and it keeps marks precise: the event it records completes
//! right after the marked work, never after unrelated work enqueued later on the same stream (how the real
//! device does that is in `driver/marks.rs`). So a wait never waits for work it does not conflict with.
//!
//! There is at most one read entry per stream. Reads on one stream complete in stream order, so the newest
//! read's completion implies every older one's; replacing the older entry keeps the set bounded by the number
//! of streams and, on the fast path of one stream reading repeatedly, keeps it from growing at all.
//!
//! A write clears the reads. `prepare` made the writing stream wait for every read on other streams, and reads
//! on the writing stream precede the write in stream order, so everything that completes after the write
//! completes after all of those reads: whoever waits for the write entry (on its stream, after it) is
//! transitively ordered after them, and the write entry alone stands for them. The same argument lets a
//! write replace the previous write.
//!
//! Entries are forgotten only once seen complete. When a [`Timeline`] call fails, the methods return its error
//! with every entry not seen complete still recorded, so a caller that cannot prove a buffer idle leaks it
//! rather than freeing it under the device ("Release after completion").
//!
//! The protocol for device work is `prepare`, then enqueue, then `record_use` with the same stream and access,
//! and nothing else on the tracker in between (the methods take `&mut self`, so a caller holds the one lock or
//! exclusive borrow across all three). Otherwise a read recorded by someone else between a write's `prepare`
//! and its `record_use` would be cleared without having been waited for. If the enqueue fails, the caller still
//! calls `record_use`: a failed enqueue may have enqueued part of its work, and recording a use that did not
//! happen is only conservative.

/// What the tracker needs from the device: marks in streams' work, device-side waits for them, and completion
/// queries.
pub(crate) trait Timeline {
    /// A stream handle: cheap to clone; equality means the same stream (the real one is an `Arc` compared by
    /// pointer, so an entry holding a clone keeps the stream, and its identity, alive).
    type Stream: Clone + Eq;
    /// A point in a stream's work, right after some enqueued work: cheap to clone; equality means the same
    /// point.
    type Mark: Clone + Eq;
    /// What a failed device call returns.
    type Error;
    /// Makes `stream` wait, on the device, until the work before `mark` (a mark of `on`) has completed. Never
    /// blocks the host; enqueues nothing if that work is known to be complete.
    fn wait(
        &self,
        stream: &Self::Stream,
        on: &Self::Stream,
        mark: &Self::Mark,
    ) -> Result<(), Self::Error>;
    /// Whether the work before `mark` (a mark of `on`) has completed, without blocking.
    fn is_complete(&self, on: &Self::Stream, mark: &Self::Mark) -> Result<bool, Self::Error>;
    /// Blocks the host until the work before `mark` (a mark of `on`) has completed.
    fn synchronize(&self, on: &Self::Stream, mark: &Self::Mark) -> Result<(), Self::Error>;
}

/// How work uses a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only; reads do not conflict with each other.
    Read,
    /// Writes (and possibly reads); conflicts with every other access.
    Write,
}

/// The device work in flight on one buffer: the last write and the reads since (see the module docs).
#[derive(Debug)]
pub(crate) struct Tracker<S, M> {
    /// The last write, unless it is known complete.
    write: Option<Entry<S, M>>,
    /// The reads since that write not known complete, at most one per stream.
    reads: Vec<Entry<S, M>>,
}

/// Device work on `stream` that uses the buffer.
#[derive(Debug)]
struct Entry<S, M> {
    /// Where the work was enqueued; holding it keeps the stream alive for a later wait.
    stream: S,
    /// The point in `stream`'s work right after it.
    mark: M,
}

impl<S: Eq, M> Entry<S, M> {
    /// Makes `stream` wait for this entry, unless the entry is on `stream` itself (stream order covers it).
    fn order_before<T>(&self, t: &T, stream: &S) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        if self.stream == *stream {
            return Ok(());
        }
        t.wait(stream, &self.stream, &self.mark)
    }

    fn is_complete<T>(&self, t: &T) -> Result<bool, T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        t.is_complete(&self.stream, &self.mark)
    }

    fn synchronize<T>(&self, t: &T) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        t.synchronize(&self.stream, &self.mark)
    }
}

impl<S, M> Default for Tracker<S, M> {
    /// No work in flight.
    fn default() -> Self {
        Tracker {
            write: None,
            reads: Vec::new(),
        }
    }
}

impl<S: Clone + Eq, M: Clone + Eq> Tracker<S, M> {
    /// A tracker with no work in flight.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether no work is recorded in flight (nothing needs waiting for).
    pub(crate) fn is_empty(&self) -> bool {
        self.write.is_none() && self.reads.is_empty()
    }

    /// The stream every entry is on, if there is exactly one such stream (`None` when nothing is in flight or
    /// the entries are on several streams): work enqueued there next is ordered after all of it for free.
    pub(crate) fn sole_stream(&self) -> Option<&S> {
        let mut entries = self.write.iter().chain(&self.reads);
        let first = &entries.next()?.stream;
        entries.all(|entry| entry.stream == *first).then_some(first)
    }

    /// Every entry's stream and mark, cloned: for a caller that waits for them (with [`Timeline::synchronize`])
    /// without holding the lock the tracker is behind. The entries stay recorded.
    pub(crate) fn marks(&self) -> Vec<(S, M)> {
        // A host write conflicts with every entry.
        self.conflicts(Access::Write)
    }

    /// The stream and mark of every entry that conflicts with a host `access` (as in [`Tracker::host_wait`]),
    /// cloned: for a caller that waits for them without the lock and leaves them recorded.
    pub(crate) fn conflicts(&self, access: Access) -> Vec<(S, M)> {
        let reads = match access {
            Access::Read => &[][..],
            Access::Write => &self.reads[..],
        };
        self.write
            .iter()
            .chain(reads)
            .map(|entry| (entry.stream.clone(), entry.mark.clone()))
            .collect()
    }

    /// The stream and mark of one entry that conflicts with a host `access` (as in [`Tracker::host_wait`]), if
    /// any: the write first. For a caller that waits for it without holding the lock the tracker is behind, then
    /// asks again.
    pub(crate) fn first_conflict(&self, access: Access) -> Option<(S, M)> {
        let reads = match access {
            Access::Read => None,
            Access::Write => self.reads.first(),
        };
        self.write
            .as_ref()
            .or(reads)
            .map(|entry| (entry.stream.clone(), entry.mark.clone()))
    }

    /// How many entries [`Tracker::record_use`] of `access` on `stream` would replace that are at `mark`: the
    /// caller's way to know whether anything else still needs the work before `mark` (see `driver/marks.rs`).
    pub(crate) fn replaced_at<Q: ?Sized>(&self, stream: &S, mark: &Q, access: Access) -> usize
    where
        M: PartialEq<Q>,
    {
        let at = |entry: &Entry<S, M>| entry.stream == *stream && entry.mark == *mark;
        let read = self.reads.iter().filter(|read| at(read)).count();
        match access {
            Access::Read => read,
            Access::Write => read + usize::from(self.write.as_ref().is_some_and(at)),
        }
    }

    /// Makes `stream` wait, on the device, for every entry on another stream that conflicts with `access`:
    /// the pending write for a read; the write and all reads for a write. Call it before enqueueing the work.
    ///
    /// Returns at once; the waits are on the device. Nothing in flight is added or forgotten, so if the work
    /// then fails to enqueue the tracker needs no repair.
    ///
    /// # Errors
    /// The first failed `wait`. Waits already enqueued stay (they only delay `stream`), and the caller must not
    /// enqueue the work.
    pub(crate) fn prepare<T>(&mut self, t: &T, stream: &S, access: Access) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        if let Some(write) = &self.write {
            write.order_before(t, stream)?;
        }
        if access == Access::Write {
            for read in &self.reads {
                read.order_before(t, stream)?;
            }
        }
        Ok(())
    }

    /// Records work that `access`es the buffer, just enqueued on `stream` (ending at `mark`) after a successful
    /// [`Tracker::prepare`] with the same stream and access.
    ///
    /// A read replaces the previous read of the same stream; a write replaces the pending write and clears the
    /// reads, which `prepare` made it wait for (see the module docs).
    pub(crate) fn record_use(&mut self, stream: &S, mark: &M, access: Access) {
        match access {
            Access::Read => match self.reads.iter_mut().find(|read| read.stream == *stream) {
                // The same mark again (the fast path of one stream): nothing to change.
                Some(read) if read.mark == *mark => {}
                Some(read) => read.mark = mark.clone(),
                None => self.reads.push(Entry {
                    stream: stream.clone(),
                    mark: mark.clone(),
                }),
            },
            Access::Write => {
                match &mut self.write {
                    // Same stream: keep the handle rather than swap one clone for another.
                    Some(write) if write.stream == *stream => {
                        if write.mark != *mark {
                            write.mark = mark.clone();
                        }
                    }
                    write => {
                        *write = Some(Entry {
                            stream: stream.clone(),
                            mark: mark.clone(),
                        })
                    }
                }
                // `clear` keeps the capacity, so the next reads do not allocate again.
                self.reads.clear();
            }
        }
    }

    /// Blocks the host until the device work that conflicts with a host `access` has completed: the pending
    /// write for a host read; the write and every read for a host write. Then forgets that work, so after a
    /// host write nothing is in flight, and after a host read only the reads (which do not conflict) may be.
    ///
    /// # Errors
    /// The first failed `synchronize`; the work not yet seen complete stays recorded, and the host must not
    /// access the buffer.
    pub(crate) fn host_wait<T>(&mut self, t: &T, access: Access) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        if let Some(write) = &self.write {
            write.synchronize(t)?;
            self.write = None;
        }
        if access == Access::Write {
            // Pop each read only once it is complete, so that an error leaves the rest recorded.
            while let Some(read) = self.reads.last() {
                read.synchronize(t)?;
                self.reads.pop();
            }
        }
        Ok(())
    }

    /// Whether the device work that conflicts with a host `access` (as in [`Tracker::host_wait`]) has
    /// completed, without blocking. Forgets every conflicting entry seen complete.
    ///
    /// # Errors
    /// The first failed `is_complete`; the entries not seen complete stay recorded.
    pub(crate) fn try_host<T>(&mut self, t: &T, access: Access) -> Result<bool, T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        let mut complete = forget_if_complete(&mut self.write, t)?;
        if access == Access::Write {
            // Query the reads even when the write is pending: it forgets the reads that have completed, so
            // later polls have less to do.
            complete &= forget_complete(&mut self.reads, t)?;
        }
        Ok(complete)
    }

    /// Whether every entry has completed, without blocking: when true, the memory can be released ("Release after completion").
    /// Forgets the entries seen complete.
    ///
    /// # Errors
    /// The first failed `is_complete`; the entries not seen complete stay recorded.
    pub(crate) fn is_idle<T>(&mut self, t: &T) -> Result<bool, T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        self.try_host(t, Access::Write)
    }

    /// Makes `stream` wait, on the device, for every entry on another stream, so that the work enqueued on
    /// `stream` next (typically a stream-ordered free) runs after all work on the buffer; entries on `stream`
    /// itself precede it in stream order. The entries stay recorded.
    ///
    /// Returns at once; the waits are on the device.
    ///
    /// # Errors
    /// The first failed `wait`; then `stream` is not ordered after the work, and the buffer must not be freed
    /// on it.
    pub(crate) fn order_before<T>(&mut self, t: &T, stream: &S) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        // A write conflicts with everything, so its waits are exactly these.
        self.prepare(t, stream, Access::Write)
    }

    /// Blocks the host until all recorded work has completed; afterwards nothing is in flight.
    ///
    /// # Errors
    /// As [`Tracker::host_wait`]: the work not yet seen complete stays recorded.
    pub(crate) fn synchronize_all<T>(&mut self, t: &T) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        self.host_wait(t, Access::Write)
    }
}

/// Forgets `entry` if it has completed; whether nothing is left.
fn forget_if_complete<S: Eq, M, T>(entry: &mut Option<Entry<S, M>>, t: &T) -> Result<bool, T::Error>
where
    T: Timeline<Stream = S, Mark = M>,
{
    if let Some(pending) = entry {
        if !pending.is_complete(t)? {
            return Ok(false);
        }
        *entry = None;
    }
    Ok(true)
}

/// Forgets the entries that have completed; whether none is left. On error the entries not yet seen complete
/// are all still there.
fn forget_complete<S: Eq, M, T>(entries: &mut Vec<Entry<S, M>>, t: &T) -> Result<bool, T::Error>
where
    T: Timeline<Stream = S, Mark = M>,
{
    let mut i = 0;
    while i < entries.len() {
        if entries[i].is_complete(t)? {
            // The order of the reads carries no meaning.
            entries.swap_remove(i);
        } else {
            i += 1;
        }
    }
    Ok(entries.is_empty())
}

// The simulated device of the tests and of the pool model in `fuzzing.rs`, which uses only part of it.
#[cfg(any(test, fuzzing))]
#[cfg_attr(not(test), allow(dead_code, reason = "the rest serves the tests"))]
pub(crate) mod sim;
#[cfg(test)]
mod tests;
