//! The device work in flight on one buffer, as a pure state machine (safety rules 1, 2 and 4 of the crate).
//!
//! A [`Tracker`] records the last device write to a buffer and the device reads since, each as an entry: the
//! stream the work was enqueued on and, once someone has needed one, an event recorded on that stream after the
//! work. Before work on stream `S` uses the buffer, [`Tracker::prepare`] makes `S` wait on the device for every
//! conflicting entry of another stream; after the work is enqueued, [`Tracker::record_use`] adds it. The host
//! side ([`Tracker::host_wait`], [`Tracker::try_host`]) and release ([`Tracker::is_idle`],
//! [`Tracker::order_before`], [`Tracker::synchronize_all`]) wait for or query the same entries. Everything
//! device-specific goes through the [`Timeline`] trait, so this module has no FFI and is tested on the CPU
//! against a simulated device.
//!
//! Events are recorded lazily. Most work on a buffer stays on one stream, where stream order alone is enough,
//! and recording an event there would cost a driver call for nothing. So an entry starts without an event and
//! gets one only when another stream or the host first has to wait for it. An event recorded then, at the tail
//! of the entry's stream, completes after the work and possibly after later work on that stream too: waiting
//! for it waits longer than needed but never too little. The event is kept, so further waiters reuse it.
//!
//! There is at most one read entry per stream. Reads on one stream complete in stream order, so the newest
//! read's completion implies every older one's; replacing the older entry (with no event again, because the
//! old event may predate the new read) keeps the set bounded by the number of streams and, on the fast path
//! of one stream reading repeatedly, keeps it from growing at all.
//!
//! A write clears the reads. `prepare` made the writing stream wait for every read on other streams, and reads
//! on the writing stream precede the write in stream order, so everything that completes after the write
//! completes after all of those reads: whoever waits for the write entry (on its stream, after it) is
//! transitively ordered after them, and the write entry alone stands for them. The same argument lets a
//! write replace the previous write.
//!
//! Entries are forgotten only once seen complete. When a [`Timeline`] call fails, the methods return its error
//! with every entry not seen complete still recorded (a recorded event may stay), so a caller that cannot
//! prove a buffer idle leaks it rather than freeing it under the device (rule 4).
//!
//! The protocol for device work is `prepare`, then enqueue, then `record_use` with the same stream and access,
//! and nothing else on the tracker in between (the methods take `&mut self`, so a caller holds the one lock or
//! exclusive borrow across all three). Otherwise a read recorded by someone else between a write's `prepare`
//! and its `record_use` would be cleared without having been waited for. If the enqueue fails, the caller still
//! calls `record_use`: a failed enqueue may have enqueued part of its work, and recording a use that did not
//! happen is only conservative. (Skipping it would also leave the tracker consistent, because `prepare` changes
//! nothing but lazily recorded events, but would miss such partial work.)

/// What the tracker needs from the device: recording events, device-side waits, and completion queries.
pub(crate) trait Timeline {
    /// A stream handle: cheap to clone; equality means the same stream (the real one is an `Arc` compared by
    /// pointer, so an entry holding a clone keeps the stream, and its identity, alive).
    type Stream: Clone + Eq;
    /// An event recorded on a stream; complete once all work enqueued on that stream before it has run.
    type Event: Clone;
    /// What a failed device call returns.
    type Error;
    /// Records an event on `stream` after everything enqueued on it so far.
    fn record(&self, stream: &Self::Stream) -> Result<Self::Event, Self::Error>;
    /// Makes `stream` wait, on the device, for `event` (never blocks the host).
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<(), Self::Error>;
    /// Whether `event` has completed, without blocking.
    fn is_complete(&self, event: &Self::Event) -> Result<bool, Self::Error>;
    /// Whether everything enqueued on `stream` so far has completed, without blocking.
    fn is_idle(&self, stream: &Self::Stream) -> Result<bool, Self::Error>;
    /// Blocks the host until `event` has completed.
    fn synchronize(&self, event: &Self::Event) -> Result<(), Self::Error>;
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
pub(crate) struct Tracker<S, E> {
    /// The last write, unless it is known complete.
    write: Option<Entry<S, E>>,
    /// The reads since that write not known complete, at most one per stream.
    reads: Vec<Entry<S, E>>,
}

/// Device work on `stream` that uses the buffer.
#[derive(Debug)]
struct Entry<S, E> {
    /// Where the work was enqueued; holding it keeps the stream alive for a later `record`.
    stream: S,
    /// An event on `stream` after the work; `None` until something other than `stream` needs to wait for it.
    event: Option<E>,
}

impl<S, E> Entry<S, E> {
    /// An entry for work just enqueued on `stream`, with no event yet.
    fn new(stream: S) -> Self {
        Entry {
            stream,
            event: None,
        }
    }

    /// The entry's event, recorded now if it has none yet.
    fn event<T>(&mut self, t: &T) -> Result<&E, T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
    {
        let event = match self.event.take() {
            Some(event) => event,
            // On failure `self.event` is None, as it was.
            None => t.record(&self.stream)?,
        };
        Ok(self.event.insert(event))
    }

    /// Makes `stream` wait for this entry, unless the entry is on `stream` itself (stream order covers it).
    fn order_before<T>(&mut self, t: &T, stream: &S) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
        S: Eq,
    {
        if self.stream == *stream {
            return Ok(());
        }
        let event = self.event(t)?;
        t.wait(stream, event)
    }

    /// Whether the work has completed, recording the event first if needed so that later polls can query it.
    fn is_complete<T>(&mut self, t: &T) -> Result<bool, T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
    {
        // Without an event yet, an idle stream answers as well, and recording one now would make the answer
        // wait for that event to be processed (a poll right after a stream synchronize would say "not yet").
        if self.event.is_none() && t.is_idle(&self.stream)? {
            return Ok(true);
        }
        let event = self.event(t)?;
        t.is_complete(event)
    }

    /// Blocks until the work has completed.
    fn synchronize<T>(&mut self, t: &T) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
    {
        let event = self.event(t)?;
        t.synchronize(event)
    }
}

impl<S, E> Default for Tracker<S, E> {
    /// No work in flight.
    fn default() -> Self {
        Tracker {
            write: None,
            reads: Vec::new(),
        }
    }
}

impl<S: Clone + Eq, E> Tracker<S, E> {
    /// A tracker with no work in flight.
    // The buffers build theirs with `Default` (and `mem::take`); `new` and `is_empty` are kept for callers
    // that want the plain names and for the tests, so they are unused outside `cfg(test)` for now.
    #[allow(dead_code, reason = "not used by the buffers yet; see above")]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether no work is recorded in flight (nothing needs waiting for).
    #[allow(dead_code, reason = "not used by the buffers yet; see `new`")]
    pub(crate) fn is_empty(&self) -> bool {
        self.write.is_none() && self.reads.is_empty()
    }

    /// The stream of the pending write, else of some read: a stream on which a stream-ordered free is already
    /// ordered after some of the work, to pass to [`Tracker::order_before`]. `None` when nothing is in flight.
    pub(crate) fn any_stream(&self) -> Option<&S> {
        self.write
            .as_ref()
            .or_else(|| self.reads.first())
            .map(|entry| &entry.stream)
    }

    /// Makes `stream` wait, on the device, for every entry on another stream that conflicts with `access`:
    /// the pending write for a read; the write and all reads for a write. Call it before enqueueing the work.
    ///
    /// Returns at once; the waits are on the device. Nothing in flight is added or forgotten, only lazily
    /// recorded events filled in, so if the work then fails to enqueue the tracker needs no repair.
    ///
    /// # Errors
    /// The first failed `record` or `wait`. Waits already enqueued stay (they only delay `stream`), and the
    /// caller must not enqueue the work.
    pub(crate) fn prepare<T>(&mut self, t: &T, stream: &S, access: Access) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
    {
        if let Some(write) = &mut self.write {
            write.order_before(t, stream)?;
        }
        if access == Access::Write {
            for read in &mut self.reads {
                read.order_before(t, stream)?;
            }
        }
        Ok(())
    }

    /// Records work that `access`es the buffer, just enqueued on `stream` after a successful
    /// [`Tracker::prepare`] with the same stream and access.
    ///
    /// Records no event: that is left to whoever first needs to wait for the work. A read replaces the previous
    /// read of the same stream; a write replaces the pending write and clears the reads, which `prepare` made
    /// it wait for (see the module docs).
    pub(crate) fn record_use(&mut self, stream: &S, access: Access) {
        match access {
            Access::Read => match self.reads.iter_mut().find(|read| read.stream == *stream) {
                // The old event, if any, may predate this read, so it cannot stand for it.
                Some(read) => read.event = None,
                None => self.reads.push(Entry::new(stream.clone())),
            },
            Access::Write => {
                match &mut self.write {
                    // Same stream: keep the handle rather than swap one clone for another.
                    Some(write) if write.stream == *stream => write.event = None,
                    write => *write = Some(Entry::new(stream.clone())),
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
    /// The first failed `record` or `synchronize`; the work not yet seen complete stays recorded, and the host
    /// must not access the buffer.
    pub(crate) fn host_wait<T>(&mut self, t: &T, access: Access) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
    {
        if let Some(write) = &mut self.write {
            write.synchronize(t)?;
            self.write = None;
        }
        if access == Access::Write {
            // Pop each read only once it is complete, so that an error leaves the rest recorded.
            while let Some(read) = self.reads.last_mut() {
                read.synchronize(t)?;
                self.reads.pop();
            }
        }
        Ok(())
    }

    /// Whether the device work that conflicts with a host `access` (as in [`Tracker::host_wait`]) has
    /// completed, without blocking. Forgets every conflicting entry seen complete, and records the events of
    /// the others, so that the next poll only queries.
    ///
    /// # Errors
    /// The first failed `record` or `is_complete`; the entries not seen complete stay recorded.
    pub(crate) fn try_host<T>(&mut self, t: &T, access: Access) -> Result<bool, T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
    {
        let mut complete = forget_if_complete(&mut self.write, t)?;
        if access == Access::Write {
            // Query the reads even when the write is pending: it records their events now, and forgets the
            // reads that have completed, so later polls have less to do.
            complete &= forget_complete(&mut self.reads, t)?;
        }
        Ok(complete)
    }

    /// Whether every entry has completed, without blocking: when true, the memory can be released (rule 4).
    /// Forgets the entries seen complete and records the events of the others.
    ///
    /// # Errors
    /// The first failed `record` or `is_complete`; the entries not seen complete stay recorded.
    pub(crate) fn is_idle<T>(&mut self, t: &T) -> Result<bool, T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
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
    /// The first failed `record` or `wait`; then `stream` is not ordered after the work, and the buffer must
    /// not be freed on it.
    pub(crate) fn order_before<T>(&mut self, t: &T, stream: &S) -> Result<(), T::Error>
    where
        T: Timeline<Stream = S, Event = E>,
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
        T: Timeline<Stream = S, Event = E>,
    {
        self.host_wait(t, Access::Write)
    }
}

/// Forgets `entry` if it has completed; whether nothing is left.
fn forget_if_complete<S, E, T>(entry: &mut Option<Entry<S, E>>, t: &T) -> Result<bool, T::Error>
where
    T: Timeline<Stream = S, Event = E>,
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
fn forget_complete<S, E, T>(entries: &mut Vec<Entry<S, E>>, t: &T) -> Result<bool, T::Error>
where
    T: Timeline<Stream = S, Event = E>,
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

// Also the simulated device of the pool model in `fuzzing.rs`, which uses only part of it.
#[cfg_attr(not(test), allow(dead_code, reason = "the rest serves the tests"))]
pub(crate) mod sim;
#[cfg(test)]
mod tests;
