//! The release thread: where page-locked host memory is unpinned and freed, once no device work uses it; and
//! until then, the cache that lends that memory again.
//!
//! Unpinning (`cuMemFreeHost`, `cuMemHostUnregister`) and the synchronous `cuMemFree` make the calling thread
//! wait until *all* work on the device has finished, whoever enqueued it, and hold back every other thread's
//! driver calls meanwhile (measured on an H100: a drop of an idle 4 MiB buffer took as long as a 300 ms kernel
//! on another stream, and so did a copy another thread enqueued during it). Doing that in `drop` would make the
//! user's threads wait for work they have nothing to do with (the crate's rule "No hidden waits"), so every release is handed
//! to one process-wide thread, `cuda-pinned-release`, and the caller returns at once. The thread keeps each
//! block until the device work recorded on it has completed ("Release after completion") and until every device is idle (see
//! `release_idle`), polls with a growing pause, and reports what it cannot do through the block's context
//! ([`Context::check_deferred_errors`]).
//!
//! A loop that keeps some device busy at every moment never gives the thread that moment, so what waits for it
//! is reused instead ("Bounded in steady state"): a block of page-locked memory whose own work has completed serves the next
//! request that fits it ([`reuse`]: a `Pinned` of its own, a pool's new block, a `Registered` of the same
//! size) with no driver call, and so the page-locked memory of a loop stays what one iteration holds. What the
//! thread releases when the devices are idle is what nobody took.
//!
//! The list is process-wide rather than per context so that nothing but completed work ends an entry:
//! dropping every handle of a context must not release memory a copy still uses. Each entry keeps a clone of
//! its context, so the primary context (which owns pinned allocations) stays retained until the memory is
//! released. [`Context::synchronize`] waits for the thread to release what that synchronization made idle.
//!
//! Where the thread cannot be started, a release runs on the caller's thread as it did before: correct, only
//! not free of the wait.

use std::sync::{Condvar, Mutex, MutexGuard, Once, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Duration;

use super::block::Block;
use super::tracked::{Gpu, GpuTracker};
use crate::driver::Context;
use crate::error::{Error, Result};
use crate::exit;
use crate::future::Resolved;
use crate::units::Bytes;

/// Unpins and frees a block of host memory (or frees device memory); run once, when no device work uses it,
/// with the block's context current.
pub(crate) type Release = Box<dyn FnOnce() -> Result<()> + Send>;

struct Pending {
    /// Tells the entry apart from every other, even one at the same address after this one was freed.
    id: u64,
    context: Context,
    track: GpuTracker,
    held: Held,
    bytes: usize,
}

/// What an entry releases.
enum Held {
    /// Page-locked memory, which [`reuse`] may lend again once its work has completed.
    Block(Block),
    /// Anything else (device memory, a module): run once, when its work has completed.
    Other(Release),
}

/// What the release thread shares with everyone else.
struct Service {
    state: Mutex<State>,
    /// Signalled when work arrives for the thread (a block, a flush).
    arrived: Condvar,
    /// Signalled when the thread finishes a round.
    round_done: Condvar,
}

#[derive(Default)]
struct State {
    /// Everything handed over and not yet released or reused.
    pending: Vec<Pending>,
    /// Whether something was handed over since the thread last looked.
    arrived: bool,
    /// Rounds the thread has started: each takes every block handed over before it.
    started: u64,
    /// The last round the thread has finished.
    finished: u64,
    /// Whether someone waits for a round to start after their call (so one starts even with nothing new).
    flush_requested: bool,
    /// Tasks awaiting a round ([`Flushed`]): the round each waits for, and its waker.
    flush_wakers: Vec<(u64, Waker)>,
    /// The next entry's id.
    next_id: u64,
    /// The trackers of blocks lent again by [`reuse`], their work completed, for the thread to drop: a tracker
    /// may hold the last handle of a stream, and a stream's drop takes its device's gate, which the thread holds
    /// while it releases (the user's thread would wait for that).
    spent: Vec<GpuTracker>,
}

/// The release thread, started on first use; `None` if it could not be started.
fn service() -> Option<&'static Service> {
    static SERVICE: OnceLock<Option<&'static Service>> = OnceLock::new();
    *SERVICE.get_or_init(|| {
        let service: &'static Service = Box::leak(Box::new(Service {
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            round_done: Condvar::new(),
        }));
        guard_exit_once();
        std::thread::Builder::new()
            .name("cuda-pinned-release".into())
            .spawn(move || service.run())
            .ok()
            .map(|_| service)
    })
}

impl Service {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics under this lock but a bug; the state is a list and counters, valid whatever happened.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The thread: releases the entries whose work has completed once every device is idle, and polls the
    /// others with a pause that grows from 50 us to 20 ms while nothing changes.
    fn run(&self) {
        const FIRST_PAUSE: Duration = Duration::from_micros(50);
        const LONGEST_PAUSE: Duration = Duration::from_millis(20);
        let mut pause = FIRST_PAUSE;
        loop {
            let mut state = self.lock();
            while state.pending.is_empty() && !state.flush_requested && state.spent.is_empty() {
                state = self
                    .arrived
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let arrived = state.arrived || state.flush_requested;
            state.arrived = false;
            state.flush_requested = false;
            state.started += 1;
            let round = state.started;
            let spent = std::mem::take(&mut state.spent);
            drop(state);

            let released = {
                let _calls = exit::driver_calls();
                if exit::exiting() {
                    // The process is ending: what is left stays pinned until the system reclaims it, and no
                    // driver call is made (dropping a tracker may destroy a stream). Anyone waiting for a round
                    // (an exit hook of the user's that synchronizes) is let go.
                    std::mem::forget(spent);
                    let mut state = self.lock();
                    std::mem::forget(std::mem::take(&mut state.spent));
                    std::mem::forget(std::mem::take(&mut state.pending));
                    state.finished = u64::MAX;
                    self.round_done.notify_all();
                    let wakers = std::mem::take(&mut state.flush_wakers);
                    drop(state);
                    // Woken once the exit hook may go on: a waker is others' code.
                    drop(_calls);
                    wake_all(wakers.into_iter().map(|(_, waker)| waker));
                    return;
                }
                drop(spent);
                Context::sweep_drained();
                release_idle(|| std::mem::take(&mut self.lock().pending))
                    .map(|(released, kept)| {
                        self.lock().pending.extend(kept);
                        released
                    })
                    .unwrap_or(false)
            };

            let mut state = self.lock();
            state.finished = round;
            self.round_done.notify_all();
            if !state.flush_wakers.is_empty() {
                let (done, waiting) = std::mem::take(&mut state.flush_wakers)
                    .into_iter()
                    .partition(|&(target, _)| target <= round);
                state.flush_wakers = waiting;
                drop(state);
                wake_all(done.into_iter().map(|(_, waker): (u64, Waker)| waker));
                state = self.lock();
            }
            if state.pending.is_empty() {
                pause = FIRST_PAUSE;
                continue;
            }
            pause = if arrived || released {
                FIRST_PAUSE
            } else {
                (pause * 2).min(LONGEST_PAUSE)
            };
            if !state.arrived && !state.flush_requested {
                drop(
                    self.arrived
                        .wait_timeout(state, pause)
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
        }
    }
}

/// [`exit::guard_exit`], once per process from the release thread's start.
fn guard_exit_once() {
    static GUARDED: Once = Once::new();
    GUARDED.call_once(exit::guard_exit);
}

/// Releases host memory once no device work uses it, on the release thread: returns at once. Never frees
/// early: where the state of the work cannot be read, the memory is leaked and the error kept for
/// [`Context::check_deferred_errors`].
pub(crate) fn release_host(context: &Context, track: GpuTracker, release: Release, bytes: usize) {
    hand_over(Pending {
        id: 0,
        context: context.clone(),
        track,
        held: Held::Other(release),
        bytes,
    });
}

/// Hands a block of page-locked memory of `context` to the release thread, which unpins it once `track`'s
/// work has completed and every device is idle; until then [`reuse`] may lend it again. Returns at once.
pub(crate) fn retire(context: &Context, track: GpuTracker, block: Block) {
    let bytes = block.bytes;
    hand_over(Pending {
        id: 0,
        context: context.clone(),
        track,
        held: Held::Block(block),
        bytes,
    });
}

fn hand_over(mut pending: Pending) {
    match service() {
        Some(service) => {
            let mut state = service.lock();
            pending.id = state.next_id;
            state.next_id += 1;
            state.pending.push(pending);
            state.arrived = true;
            drop(state);
            service.arrived.notify_one();
        }
        None => {
            // No thread to hand it to: release it here if its work is done and the devices are idle, else
            // leak it with the reason.
            let mut kept = vec![pending];
            if let Some((_, left)) = release_idle(|| std::mem::take(&mut kept)) {
                kept = left;
            }
            for p in kept {
                forget_leaked(
                    p,
                    Error::invalid("the crate's release thread could not be started"),
                );
            }
        }
    }
}

/// A block of page-locked memory waiting to be unpinned that can serve a new request with no driver call:
/// one of `context`, pinned with exactly `flags`, of `bytes` to `max_bytes` bytes, for which `fits` holds,
/// whose device work has completed; the smallest such. `None` if there is none (or no release thread).
///
/// The work is checked with event queries, which return at once: the caller never waits for device work here.
/// Each candidate is taken out of the list while its work is checked, without the list's lock: a query may
/// record an event, which takes the device's gate, which the release thread holds while it takes the list.
pub(crate) fn reuse(
    context: &Context,
    flags: u32,
    bytes: usize,
    max_bytes: usize,
    fits: impl Fn(&Block) -> bool,
) -> Option<Block> {
    let service = service()?;
    let mut candidates: Vec<(usize, u64)> = service
        .lock()
        .pending
        .iter()
        .filter_map(|p| match &p.held {
            Held::Block(b)
                if b.flags == flags
                    && (bytes..=max_bytes).contains(&b.bytes)
                    && p.context == *context
                    && fits(b) =>
            {
                Some((b.bytes, p.id))
            }
            _ => None,
        })
        .collect();
    candidates.sort_unstable();
    for (_, id) in candidates {
        let mut p = {
            let mut state = service.lock();
            // Gone meanwhile (lent to another thread, or released): next.
            let Some(i) = state.pending.iter().position(|p| p.id == id) else {
                continue;
            };
            state.pending.swap_remove(i)
        };
        // An entry whose query fails goes back for the release thread, which reports it.
        if matches!(p.track.is_idle(&Gpu), Ok(true)) {
            let Pending { track, held, .. } = p;
            let mut state = service.lock();
            state.spent.push(track);
            drop(state);
            service.arrived.notify_one();
            match held {
                Held::Block(block) => return Some(block),
                Held::Other(_) => unreachable!("only blocks are candidates"),
            }
        }
        service.lock().pending.push(p);
    }
    None
}

impl Context {
    /// [`Context::synchronize`] as a future, for async code, without blocking the executor's thread: resolves
    /// once the work queued so far on every stream the crate knows in this context has completed (the streams
    /// it made or wrapped with [`Stream::from_raw`](crate::Stream::from_raw), through any handle of the
    /// context, and its own streams for frees), and then the page-locked memory dropped while that work used it
    /// has been released. Unlike [`Context::synchronize`] it does not wait for work that other code queued on
    /// streams of its own: wrap such a stream to include it. The points are taken at the call.
    ///
    /// # Errors
    /// The driver's, from closing the streams' segments or queueing their points, and the work's (a sticky
    /// error of the context); an invalid-argument error for a poll after it resolved.
    pub fn done(&self) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let refused = self.refuse_in_capture("Context::done").err();
        let (closed, points) = match refused {
            Some(_) => (Ok(()), Vec::new()),
            None => (self.close_segments(), self.every_stream_done()),
        };
        Resolved::new("Context::done", async move {
            if let Some(e) = refused {
                return Err(e);
            }
            for point in points {
                point.await?;
            }
            Flushed { target: None }.await;
            closed
        })
    }

    /// Blocks until all work in the context, on every stream, has completed, and then until the pinned memory
    /// dropped while that work used it has been released.
    ///
    /// # Errors
    /// The driver's, including errors of earlier asynchronous work.
    #[doc(alias = "cuCtxSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("Context::synchronize")?;
        // Work other code enqueues afterwards must not delay what the crate's buffers wait for (see
        // `driver/marks.rs`). A failure to close only makes later waits less precise.
        let closed = self.close_segments();
        self.synchronize_work()?;
        // Everything has completed: host memory dropped while in use can go now.
        flush_releases(self);
        closed
    }
}

/// Wakes `wakers`, others' code on the release thread: one that panics is caught.
fn wake_all(wakers: impl Iterator<Item = Waker>) {
    for waker in wakers {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
    }
}

/// [`flush_releases`] as a future: ready once the release thread has finished a round that started after the
/// first poll.
struct Flushed {
    /// The round awaited, from the first poll on.
    target: Option<u64>,
}

impl std::future::Future for Flushed {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let Some(service) = service() else {
            return std::task::Poll::Ready(());
        };
        // As in `flush_releases`: a caller holding a gate would keep the thread from its round.
        if Context::holds_a_gate() {
            return std::task::Poll::Ready(());
        }
        let mut state = service.lock();
        let target = *self.target.get_or_insert_with(|| {
            state.flush_requested = true;
            service.arrived.notify_one();
            state.started + 1
        });
        if state.finished >= target || exit::exiting() {
            return std::task::Poll::Ready(());
        }
        let (replaced, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut state.flush_wakers)
            .into_iter()
            .partition(|(_, kept)| kept.will_wake(cx.waker()));
        state.flush_wakers = kept;
        state.flush_wakers.push((target, cx.waker().clone()));
        drop(state);
        // Dropped without the lock: a waker's drop is others' code, and may hand memory to this thread.
        drop(replaced);
        std::task::Poll::Pending
    }
}

/// Waits until the release thread has looked at every block handed over before this call and released those
/// whose work has completed: after `context.synchronize()`, every block of that context. Returns at once if
/// there is no release thread.
fn flush_releases(_context: &Context) {
    let Some(service) = service() else { return };
    // The thread releases under the device's gate, which a caller holding it (inside `Stream::profile`) would
    // keep it from taking: no flush then, rather than a deadlock.
    if Context::holds_a_gate() {
        return;
    }
    let mut state = service.lock();
    // A round in progress may have taken its blocks before the caller's were handed over: wait for a round that
    // starts after this call, which the request makes happen even if nothing else arrives. Once the process is
    // exiting the thread makes no more rounds: nothing to wait for then.
    let target = state.started + 1;
    state.flush_requested = true;
    service.arrived.notify_one();
    while state.finished < target && !exit::exiting() {
        state = service
            .round_done
            .wait_timeout(state, Duration::from_millis(50))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Once every device is found idle, releases every entry `take` hands over whose work has completed: returns
/// whether it released any and the entries it kept. `None`, without calling `take`, while some device is not
/// idle: nothing can be released then, and the entries stay where they are, to be reused.
///
/// The unpinning calls wait for all work on the device, and while they wait the driver holds back every other
/// thread's calls too (measured on an H100, driver 580: a copy enqueued on an unrelated stream by another
/// thread took as long as a kernel running elsewhere). So memory is released only once every stream the
/// crate knows, on every device, is idle, checked and released under the devices' gates, which the crate's work
/// holds while it enqueues: no work of the crate can be queued between the check and the release. Work other
/// code enqueues through raw handles is not seen, and may still be waited for.
fn release_idle(take: impl FnOnce() -> Vec<Pending>) -> Option<(bool, Vec<Pending>)> {
    // Page-locked memory is mapped into every device's address space (unified addressing), and unpinning it
    // waits for the work of every device the process uses (the simulated driver's model: a block of device 0
    // unpinned while device 1 still had frees queued waited for them). So every device the crate knows must be
    // idle, each checked under its gate; work is being enqueued on a device right now if its gate cannot be
    // closed: not idle.
    let devices = Context::known_devices();
    let _closed: Vec<_> = devices
        .iter()
        .map(|&d| Context::close_gate(d))
        .collect::<Option<_>>()?;
    if !devices.iter().all(|&d| Context::device_is_idle(d)) {
        return None;
    }
    let held = take();
    let mut kept = Vec::with_capacity(held.len());
    let mut released = false;
    for mut p in held {
        match p.context.enter().and_then(|_current| p.track.is_idle(&Gpu)) {
            Ok(true) => {
                run(p);
                released = true;
            }
            Ok(false) => kept.push(p),
            Err(e) => forget_leaked(p, e.context("checking whether memory may be released")),
        }
    }
    Some((released, kept))
}

/// Leaks a block whose work cannot be known to be complete, with the reason.
fn forget_leaked(p: Pending, error: Error) {
    let Pending {
        context,
        track,
        held,
        bytes,
        ..
    } = p;
    // Forgetting the release leaks the memory, and with it any Vec the closure owns: dropping the closure
    // would free memory a copy may still write (a block has no destructor: dropping it leaks it). The tracker
    // goes too: its marks are only events.
    std::mem::forget(held);
    drop(track);
    context.keep_for_leaked_memory();
    context.defer_error(error.context(format_args!("releasing {} (leaked)", Bytes(bytes))));
}

fn run(p: Pending) {
    let Pending {
        context,
        held,
        bytes,
        ..
    } = p;
    let released = context.enter().and_then(|_current| match held {
        Held::Block(block) => block.release(),
        Held::Other(release) => release(),
    });
    if let Err(e) = released {
        context.defer_error(e.context(format_args!("releasing {}", Bytes(bytes))));
    }
}
