//! Batches built by worker threads straight into pinned memory, uploaded on a copy stream and handed to the
//! consumer ready on its own stream: the Rust form of PyTorch's `DataLoader(pin_memory=True)` followed by
//! `.to(device, non_blocking=True)`.
//!
//! A training or inference loop should never wait for its data. A [`Prefetcher`] keeps `depth` *slots*, each a
//! host batch in pinned memory (from a [`PinnedPool`]) and its device counterpart, and moves them around this
//! circle:
//!
//! ```text
//!   free slot ──▶ worker thread: fill(i, &mut host)        your closure writes pinned memory directly
//!       ▲              │                                    (no pageable copy in between)
//!       │              ▼
//!       │         copy stream: upload host ──▶ device       waits, on the device, for the consumer's
//!       │              │                                    work on the slot's previous batch
//!       │              ▼
//!       │         reorder buffer (batch i comes out i-th, or in completion order)
//!       │              │
//!       │              ▼
//!       │         consumer: next() ──▶ Prefetched           the consumer stream waits, on the device, for
//!       │                                                   the upload: the host never blocks here
//!       └──────── drop(Prefetched)                          the slot is free again
//! ```
//!
//! - **No host blocking on the consumer's path.** Delivering a batch makes the consumer's stream wait for its
//!   upload with `cuStreamWaitEvent`; the consumer's thread blocks only while no batch has been filled yet.
//! - **A slot is refilled only after the consumer is done with it.** On delivery the batch's device buffers
//!   are declared in use by the consumer stream; when the [`Prefetched`] drops, the work enqueued on that
//!   stream so far is what the next upload into the same buffers waits for (on the device). The worker
//!   refills the pinned side as soon as its previous upload has read it ([`Pinned::as_mut_slice`] waits for
//!   that), even while the consumer's kernels still run on the device side.
//! - **Bounded memory.** `depth` host batches from the pool (so within its budget) and `depth` device
//!   batches, allocated when the prefetcher is built and reused for every batch.
//! - **Errors reach the consumer in place.** A fill closure that returns an error for batch `i`, or panics,
//!   yields `Err` where batch `i` would have come (the panic is caught and becomes [`Error::Worker`], even
//!   one whose payload panics again when dropped); the stream ends after it. Nothing hangs: dropping the
//!   prefetcher stops and joins the workers, early or late, with batches still held or not, and memory still
//!   in flight is released only once its work completes (as for every buffer of the crate).
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, Pinned, PinnedPool, Prefetcher, Stream};
//!
//! fn train() -> cuda_pinned::Result<()> {
//!     let context = Context::on(0)?;
//!     let pool = PinnedPool::new(&context, 512 << 20); // the pinned memory the batches may take
//!     let compute = Stream::new(&context)?; // where the batches are used
//!     let len = 1 << 20; // elements per batch
//!     let batches = Prefetcher::<Pinned<f32>>::builder(&pool, &compute, len)
//!         .batches(1000)
//!         .workers(4)
//!         .build(|i, batch| {
//!             // Runs on a worker thread, writing the pinned buffer directly: decode, augment, ...
//!             for (k, x) in batch.as_mut_slice()?.iter_mut().enumerate() {
//!                 *x = (i * 31 + k) as f32;
//!             }
//!             Ok(())
//!         })?;
//!     let mut scratch = DeviceBuffer::<f32>::uninit(&compute, len)?;
//!     for batch in batches {
//!         let batch = batch?; // batch 0, 1, 2, ... in order
//!         // `batch` derefs to its `DeviceBuffer<f32>`, ready for work on `compute` (the stream waits for the
//!         // upload on the device). Launch kernels on `compute` here; this copy stands for them.
//!         compute.copy(&*batch, &mut scratch)?;
//!     } // each batch dropped here goes back to be refilled once the work above has run
//!     compute.synchronize()
//! }
//! # if let Err(e) = train() { eprintln!("error: {e}"); }
//! ```
//!
//! A batch of several buffers is a tuple (`(Pinned<f32>, Pinned<u32>)` for inputs and targets), an array, or
//! a struct of your own that implements [`Batch`].

mod batch;
mod gathered;
mod sharded;
mod slots;
#[cfg(test)]
mod tests;
mod worker;

use std::fmt;
use std::iter::FusedIterator;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

pub use self::batch::{Batch, DeviceParts};
pub use self::gathered::GatherBatch;
pub use self::sharded::ShardedBuilder;
use self::slots::{Slots, Take};
use crate::driver::Stream;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::memory::Pinned;
use crate::memory::{Gpu, PinnedPool, lock};
use crate::track::Access;

/// What a fill closure may fail with: any error, such as the crate's own (from [`Pinned::as_mut_slice`]) or an
/// I/O error, through `?`. The crate's errors reach the consumer unchanged; others as [`Error::Worker`].
pub type FillError = Box<dyn std::error::Error + Send + Sync>;

/// The fill closure: builds batch `index` into the pinned batch.
type Fill<B> = dyn Fn(usize, &mut B) -> std::result::Result<(), FillError> + Send + Sync;

/// A stream of batches built by worker threads into pinned memory and uploaded ahead of the consumer (see
/// the [module docs](self)). Made by [`Prefetcher::builder`]; an iterator of
/// `Result<`[`Prefetched<B>`]`>`.
///
/// Dropping it stops the workers and joins them: it returns once each has finished the batch it was building,
/// if any. Batches the consumer still holds stay valid; their memory goes back when they drop.
pub struct Prefetcher<B: Batch> {
    shared: Arc<Shared<B>>,
    consumer: Stream,
    workers: Vec<JoinHandle<()>>,
}

/// How to make a [`Prefetcher`]: `Prefetcher::<B>::builder(&pool, &consumer, layout).batches(n).build(fill)`.
#[must_use]
pub struct PrefetcherBuilder<B: Batch> {
    pool: PinnedPool,
    consumer: Stream,
    layout: B::Layout,
    workers: Option<usize>,
    depth: Option<usize>,
    ordered: bool,
    indices: Option<Indices>,
    copy: Option<Stream>,
}

/// The batch indices of a stream, by position.
#[derive(Debug)]
enum Indices {
    /// `0..n`.
    Count(usize),
    /// Given by the user.
    List(Box<[usize]>),
    /// `first, first + step, ...`, `len` of them: one feed's share of `0..n` dealt out in turn, computed
    /// when asked rather than stored (`n` may be as large as `usize::MAX`).
    Strided {
        first: usize,
        step: usize,
        len: usize,
    },
}

impl Indices {
    fn len(&self) -> usize {
        match self {
            Indices::Count(n) => *n,
            Indices::List(list) => list.len(),
            Indices::Strided { len, .. } => *len,
        }
    }

    fn get(&self, position: usize) -> usize {
        match self {
            Indices::Count(_) => position,
            Indices::List(list) => list[position],
            // At most `n - 1`, for `position < len`.
            Indices::Strided { first, step, .. } => first + position * step,
        }
    }
}

/// One slot: a host batch and its device counterpart.
struct Slot<B: Batch> {
    host: B,
    device: B::Device,
}

/// What the prefetcher, its workers and its delivered batches share.
struct Shared<B: Batch> {
    state: Mutex<Slots<Slot<B>, Error>>,
    /// Signalled when a slot becomes free (or the prefetcher stops): workers wait here.
    freed: Condvar,
    /// Signalled when a worker completes a batch: the consumer waits here.
    completed: Condvar,
    /// The consumer's task, when it awaits the next batch ([`Prefetcher::next_async`]): set under `state`'s
    /// lock, taken and woken by a worker after it completes a batch.
    waker: Mutex<Option<std::task::Waker>>,
    fill: Box<Fill<B>>,
    /// The stream the uploads run on.
    copy: Stream,
    /// Held across one batch's uploads and the recording of their events, so that the events follow that
    /// batch's uploads and no other worker's.
    uploading: Mutex<()>,
    indices: Indices,
}

/// A batch delivered by a [`Prefetcher`]: its device side, ready for work on the consumer's stream (which
/// waits for the upload on the device). Derefs to [`Batch::Device`].
///
/// Dropping it gives the slot back: the next upload into its device buffers waits, on the device, for the
/// work enqueued on the consumer's stream before the drop (and for any tracked use on other streams).
/// Forgetting it leaks the slot: the prefetcher goes on with one fewer.
pub struct Prefetched<B: Batch> {
    /// `Some` until dropped.
    slot: Option<Slot<B>>,
    index: usize,
    position: usize,
    shared: Arc<Shared<B>>,
    /// The stream the batch is used on.
    consumer: Stream,
}

impl<B: Batch> Prefetcher<B> {
    /// A builder of a prefetcher whose batches are used on `consumer` (and live on its device), their host
    /// side allocated from `pool` with `layout` (see [`Batch::Layout`]: a length for [`Pinned`]). The pool may
    /// be of another device's context: its memory serves every device's streams. To feed several devices,
    /// see [`Prefetcher::sharded`].
    pub fn builder(
        pool: &PinnedPool,
        consumer: &Stream,
        layout: B::Layout,
    ) -> PrefetcherBuilder<B> {
        PrefetcherBuilder {
            pool: pool.clone(),
            consumer: consumer.clone(),
            layout,
            workers: None,
            depth: None,
            ordered: true,
            indices: None,
            copy: None,
        }
    }

    /// The number of slots: batches built or uploaded ahead of the consumer, plus those it holds.
    #[must_use]
    pub fn depth(&self) -> usize {
        self.shared.lock().count()
    }

    /// The number of worker threads.
    #[must_use]
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The stream uploads run on.
    #[must_use]
    pub fn copy_stream(&self) -> &Stream {
        &self.shared.copy
    }

    /// Declares the batch in `slot` in use by the consumer's stream and wraps it.
    fn deliver(&self, slot: Slot<B>, position: usize) -> Result<Prefetched<B>> {
        let batch = Prefetched {
            slot: Some(slot),
            index: self.shared.indices.get(position),
            position,
            shared: self.shared.clone(),
            consumer: self.consumer.clone(),
        };
        // On failure the batch drops here and its slot goes back.
        declare::<B>(&self.consumer, batch.device())?;
        Ok(batch)
    }
}

impl<B: Batch> PrefetcherBuilder<B> {
    /// The number of worker threads that run the fill closure. Default: one per core, at most 4.
    pub fn workers(mut self, workers: usize) -> PrefetcherBuilder<B> {
        self.workers = Some(workers);
        self
    }

    /// The number of slots, each a host and a device batch: how far ahead of the consumer the workers may
    /// get, counting the batches the consumer holds. Default: twice the workers. Capped at the number of
    /// batches.
    pub fn depth(mut self, depth: usize) -> PrefetcherBuilder<B> {
        self.depth = Some(depth);
        self
    }

    /// Whether batches come out in order (default), or as soon as each is uploaded.
    pub fn ordered(mut self, ordered: bool) -> PrefetcherBuilder<B> {
        self.ordered = ordered;
        self
    }

    /// The stream yields batches `0..n`.
    pub fn batches(mut self, n: usize) -> PrefetcherBuilder<B> {
        self.indices = Some(Indices::Count(n));
        self
    }

    /// The stream yields these batch indices, in this order (a shuffled epoch, say); each is passed to the
    /// fill closure. Collected when called.
    pub fn indices(mut self, indices: impl IntoIterator<Item = usize>) -> PrefetcherBuilder<B> {
        self.indices = Some(Indices::List(indices.into_iter().collect()));
        self
    }

    /// Runs the uploads on `stream` (of the consumer's context) rather than on a new stream of the prefetcher's
    /// own: to give it a priority, or to time it with a ledger.
    pub fn copy_stream(mut self, stream: &Stream) -> PrefetcherBuilder<B> {
        self.copy = Some(stream.clone());
        self
    }

    /// Allocates the slots and starts the workers, which start filling at once. `fill(index, batch)` builds
    /// batch `index` into the pinned `batch`: through [`Pinned::as_mut_slice`] on each part, which waits
    /// until the slot's previous upload has read the memory. A slot is reused, so `fill` must write every
    /// element that matters: the memory holds an earlier batch.
    ///
    /// Returns once the slots are allocated and the threads started. Pinning new memory takes a while (about
    /// 0.4 s per GiB); a pool that already holds blocks of the size reuses them.
    ///
    /// The host batches never wait for buffers held by others (the builder holds the batches it allocated
    /// before, which no wait would bring back): when the pool's budget leaves no room for the next one, the
    /// build fails at once, after waiting only for device work on blocks given back to complete if the pool
    /// waits when full ([`WhenFull::Wait`](crate::WhenFull::Wait)).
    ///
    /// # Errors
    /// An invalid-argument error if no batches were given ([`PrefetcherBuilder::batches`] or
    /// [`PrefetcherBuilder::indices`]), for zero workers or depth, or for a copy stream of another context
    /// than the consumer's; the pool's (such as [`Error::PoolExhausted`] when `depth` host batches do not fit its
    /// budget beside what others hold) and the driver's, from the allocations; an invalid-argument error if
    /// a thread cannot start.
    pub fn build<F>(self, fill: F) -> Result<Prefetcher<B>>
    where
        F: Fn(usize, &mut B) -> std::result::Result<(), FillError> + Send + Sync + 'static,
    {
        let indices = self.indices.ok_or_else(|| {
            Error::invalid(
                "a prefetcher needs its batches: call `batches(n)` or `indices(...)` on the builder",
            )
        })?;
        let workers = self
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)));
        let depth = self.depth.unwrap_or(2 * workers);
        if workers == 0 || depth == 0 {
            return Err(Error::invalid(format_args!(
                "a prefetcher needs at least one worker and one slot, not {workers} and {depth}"
            )));
        }
        // The batches' device memory is the consumer's device's, uploaded there; the pool's memory is portable,
        // the host side of copies on any device's streams.
        let copy = match self.copy {
            Some(copy) => copy,
            None => Stream::new(self.consumer.context())?,
        };
        if copy.context() != self.consumer.context() {
            return Err(Error::invalid(format_args!(
                "the prefetcher's copy stream is on device {}, its consumer stream on device {}",
                copy.context().device().ordinal(),
                self.consumer.context().device().ordinal()
            )));
        }
        let total = indices.len();
        // The builder holds the slots allocated so far, which no wait brings back: where the pool waits when
        // full, it may wait here only for device work on blocks given back, never for buffers held.
        let pool = self.pool.waiting_only_for_device();
        let slots = (0..depth.min(total))
            .map(|_| {
                Ok(Slot {
                    host: B::alloc_host(&pool, &self.layout)?,
                    device: B::alloc_device(&copy, &self.layout)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let threads = workers.min(slots.len());
        let shared = Arc::new(Shared {
            state: Mutex::new(Slots::new(slots, total, self.ordered)),
            freed: Condvar::new(),
            completed: Condvar::new(),
            waker: Mutex::new(None),
            fill: Box::new(fill),
            copy,
            uploading: Mutex::new(()),
            indices,
        });
        let mut prefetcher = Prefetcher {
            shared,
            consumer: self.consumer,
            workers: Vec::with_capacity(threads),
        };
        for n in 0..threads {
            let shared = prefetcher.shared.clone();
            let worker = std::thread::Builder::new()
                .name(format!("cuda-pinned-prefetch-{n}"))
                .spawn(move || shared.work())
                // On error the prefetcher drops, which stops and joins the workers started so far.
                .map_err(|e| {
                    Error::invalid(format_args!("starting prefetch worker thread {n}: {e}"))
                })?;
            prefetcher.workers.push(worker);
        }
        Ok(prefetcher)
    }
}

impl<B: Batch> Shared<B> {
    fn lock(&self) -> MutexGuard<'_, Slots<Slot<B>, Error>> {
        // The machine changes state only in short sections with no user code and no FFI; a panic there would
        // be a bug of its own, so a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Records now an event for each piece of work in flight on `device`'s buffers that has none yet, so that a
/// later wait for it waits for the work enqueued so far and not for what its stream gets later.
fn mark<B: Batch>(device: &B::Device) -> Result<()> {
    let mut parts = DeviceParts::new();
    B::device_parts(device, &mut parts);
    for (track, _) in parts.parts {
        // `try_host` for a write records the events of every pending entry (and forgets those that are
        // complete): exactly the lazily recorded events, recorded now.
        lock(track).try_host(&Gpu, Access::Write)?;
    }
    Ok(())
}

/// Declares the device parts of a delivered batch written by `consumer`: the stream waits, on the device,
/// for the upload, and the next upload into the parts waits for the consumer's work on them.
fn declare<B: Batch>(consumer: &Stream, device: &B::Device) -> Result<()> {
    let mut parts = DeviceParts::new();
    B::device_parts(device, &mut parts);
    for (track, context) in parts.parts {
        if context != consumer.context() {
            return Err(Error::invalid(format_args!(
                "a prefetched batch has a buffer on device {}, its consumer stream is on device {}",
                context.device().ordinal(),
                consumer.context().device().ordinal()
            )));
        }
        // Nothing to enqueue: the tracker's `prepare` makes the stream wait, and the write recorded on the
        // consumer stream (again when the batch is given back, at the stream's end then) stands for all the
        // consumer enqueues there until it gives the batch back, tracked or not.
        consumer.tracked(None, Some(track), || Ok(()))?;
    }
    Ok(())
}

impl<B: Batch> Prefetcher<B> {
    /// [`Iterator::next`] as a future, for async code: resolves to the next batch once a worker has filled it
    /// and enqueued its upload, without blocking the executor's thread (the worker wakes the task). Dropping it
    /// before then takes nothing.
    ///
    /// # Errors
    /// As [`Iterator::next`].
    pub fn next_async(&mut self) -> NextBatch<'_, B> {
        NextBatch { prefetcher: self }
    }

    /// The next batch as [`Iterator::next`] gives it, or `None` while a worker has still to complete it: then
    /// `waker` is woken when one completes.
    fn take_next(&mut self, waker: &std::task::Waker) -> Option<Option<Result<Prefetched<B>>>> {
        let taken = {
            let mut state = self.shared.lock();
            match state.take() {
                Take::Wait => {
                    // Under the state's lock: a worker completes a batch under it, and takes the waker after.
                    let replaced = self
                        .shared
                        .waker
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .replace(waker.clone());
                    drop(state);
                    // Dropped without the locks: a waker's drop is others' code.
                    drop(replaced);
                    return None;
                }
                taken => taken,
            }
        };
        Some(self.answer(taken))
    }

    /// What the consumer gets for `taken`, anything but [`Take::Wait`].
    fn answer(&mut self, taken: Take<Slot<B>, Error>) -> Option<Result<Prefetched<B>>> {
        match taken {
            Take::Batch { slot, position } => Some(self.deliver(slot, position)),
            Take::Failed { error, .. } => Some(Err(error)),
            Take::AllHeld => Some(Err(Error::invalid(format_args!(
                "all {} slots of the prefetcher are held by the consumer; drop a batch or raise the depth",
                self.depth()
            )))),
            Take::End => None,
            Take::Wait => unreachable!("prefetch: a wait is not an answer"),
        }
    }
}

/// A future of the next batch of a [`Prefetcher`] ([`Prefetcher::next_async`]).
#[must_use = "a future does nothing unless awaited"]
pub struct NextBatch<'a, B: Batch> {
    prefetcher: &'a mut Prefetcher<B>,
}

impl<B: Batch> std::future::Future for NextBatch<'_, B> {
    type Output = Option<Result<Prefetched<B>>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.prefetcher.take_next(cx.waker()) {
            Some(next) => std::task::Poll::Ready(next),
            None => std::task::Poll::Pending,
        }
    }
}

impl<B: Batch> Iterator for Prefetcher<B> {
    type Item = Result<Prefetched<B>>;

    /// The next batch: in order (or as uploaded, when unordered), ready on the consumer's stream.
    ///
    /// Blocks the calling thread only until the batch has been filled and its upload enqueued; the upload
    /// itself is waited for on the device, by the consumer's stream.
    ///
    /// # Errors
    /// The fill closure's error (or [`Error::Worker`] for a panic) in the failed batch's place, after which
    /// the stream ends (`None`); the driver's, from making the consumer stream wait, after which the stream
    /// goes on. An invalid-argument error, at once and not ending the stream, if the consumer holds every
    /// slot: no batch can be built until it drops one (or a bigger depth is chosen).
    fn next(&mut self) -> Option<Result<Prefetched<B>>> {
        let taken = {
            let mut state = self.shared.lock();
            loop {
                match state.take() {
                    Take::Wait => {
                        state = self
                            .shared
                            .completed
                            .wait(state)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    taken => break taken,
                }
            }
        };
        self.answer(taken)
    }
}

impl<B: Batch> FusedIterator for Prefetcher<B> {}

impl<B: Batch> Drop for Prefetcher<B> {
    fn drop(&mut self) {
        let idle = self.shared.lock().stop();
        self.shared.freed.notify_all();
        // Unused slots go now: host blocks back to the pool, device memory freed after its pending work.
        drop(idle);
        for worker in self.workers.drain(..) {
            // A worker catches the panics of user code, so only a bug of the prefetcher could make it fail;
            // drop has no one to report it to.
            let _ = worker.join();
        }
    }
}

impl<B: Batch> fmt::Debug for Prefetcher<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Prefetcher")
            .field("depth", &state.count())
            .field("workers", &self.workers.len())
            .field("batches", &state.total())
            .field("slots", &state.counts())
            .finish()
    }
}

impl<B: Batch> fmt::Debug for PrefetcherBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefetcherBuilder")
            .field("workers", &self.workers)
            .field("depth", &self.depth)
            .field("ordered", &self.ordered)
            .field("batches", &self.indices.as_ref().map(Indices::len))
            .finish_non_exhaustive()
    }
}

impl<B: Batch> Prefetched<B> {
    /// The batch's index, as passed to the fill closure.
    #[must_use]
    pub fn index(&self) -> usize {
        self.index
    }

    /// The batch's place in the stream: its place in the list of indices (the index itself for
    /// `batches(n)`), whether or not it was delivered in order.
    #[must_use]
    pub fn position(&self) -> usize {
        self.position
    }

    /// The batch on the device.
    #[must_use]
    pub fn device(&self) -> &B::Device {
        &self.slot().device
    }

    /// The batch on the device, to change in place.
    #[must_use]
    pub fn device_mut(&mut self) -> &mut B::Device {
        &mut self
            .slot
            .as_mut()
            .expect("prefetch: a Prefetched holds its slot until it drops")
            .device
    }

    /// The batch in pinned memory, as the fill closure left it. Reading it ([`Pinned::as_slice`]) does not
    /// wait: the upload only reads it too.
    #[must_use]
    pub fn host(&self) -> &B {
        &self.slot().host
    }

    fn slot(&self) -> &Slot<B> {
        self.slot
            .as_ref()
            .expect("prefetch: a Prefetched holds its slot until it drops")
    }
}

impl<B: Batch> Deref for Prefetched<B> {
    type Target = B::Device;

    fn deref(&self) -> &B::Device {
        self.device()
    }
}

impl<B: Batch> DerefMut for Prefetched<B> {
    fn deref_mut(&mut self) -> &mut B::Device {
        self.device_mut()
    }
}

impl<B: Batch> Drop for Prefetched<B> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        // The consumer's use, declared again at the stream's end, covers all it enqueued before this drop,
        // through the crate or not (its own kernels); its event, recorded now, nothing after, so the refill does
        // not wait for its later batches. If that fails, the use declared on delivery stays, and the refill
        // waits for it: too little only if the consumer enqueued untracked work, and the failure is reported.
        // A destructor reports through the context.
        let declared =
            declare::<B>(&self.consumer, &slot.device).and_then(|()| mark::<B>(&slot.device));
        if let Err(e) = declared {
            self.shared.copy.context().defer_error(
                e.context("recording the end of the consumer's work on a prefetched batch"),
            );
        }
        let stopped = self.shared.lock().give_back(slot);
        self.shared.freed.notify_one();
        // After a stop the slot is freed here, outside the lock.
        drop(stopped);
    }
}

impl<B: Batch> fmt::Debug for Prefetched<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prefetched")
            .field("index", &self.index)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}
