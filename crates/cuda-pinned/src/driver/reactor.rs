//! The reactor: one thread of the crate's that learns when device work has completed and wakes the futures
//! waiting for it ([`super::done::Done`]), so that no executor thread ever blocks in a driver call.
//!
//! A future's point in a stream is a *flag*: a word of page-locked host memory that the stream itself writes
//! (`cuStreamWriteValue32_v2`) once the work queued before it has completed. The words live in chunks of
//! [`CHUNK`] that the reactor allocates once and never frees, registered with the driver; a word is lent to
//! one future at a time and taken back only after its write has landed, and each write carries a value of its
//! own, so a word read never answers for another future. Reading a word costs the scanner nothing a driver call
//! would: one pass over 100,000 pending flags is a pass over memory. Where a stream cannot write (a driver
//! without stream memory operations, memory the driver refuses), and for points that are events (an
//! [`Event`](super::Event), the segment a buffer's tracker waits for), the scanner queries an event instead.
//!
//! The scanner sleeps while nothing is pending and is woken by the registration that makes something pending.
//! While something is, it passes over everything pending without pause for [`SPIN`] after the last completion
//! or registration, then yields the processor between passes until [`YIELD`], then naps [`NAP`] between passes:
//! a future whose work completes soon is woken within a pass, one that waits long costs a core little.
//!
//! A stream's flag never lands after its context takes a sticky error (a kernel that traps): so every
//! [`HEALTH`] the scanner queries one stream of each context with flags pending, and where that fails, each
//! such stream, ending the futures of the failed ones with the error. Their words stay lent: whether a write
//! queued in a failed context can still land is not known.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::calls;
use super::marks::PooledEvent;
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::sys::{
    CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE, CUcontext, CUdeviceptr, CUresult,
    CUstream,
};

/// Words per chunk of flags (16 KiB, four pages).
const CHUNK: usize = 4096;
/// The host's page size, which a chunk is aligned to.
const PAGE: usize = 4096;
/// How long the scanner passes without pause after the last completion or registration.
const SPIN: Duration = Duration::from_micros(200);
/// Until when, after that, it yields between passes.
const YIELD: Duration = Duration::from_millis(2);
/// How long it naps between passes after that.
const NAP: Duration = Duration::from_micros(20);
/// How often it looks for contexts with a sticky error among those with flags pending.
const HEALTH: Duration = Duration::from_millis(1);

/// The process's reactor.
pub(crate) fn reactor() -> &'static Reactor {
    static REACTOR: OnceLock<Reactor> = OnceLock::new();
    REACTOR.get_or_init(|| Reactor {
        shared: Mutex::new(Shared::default()),
        arrived: Condvar::new(),
        asleep: AtomicBool::new(false),
    })
}

pub(crate) struct Reactor {
    shared: Mutex<Shared>,
    /// What the scanner sleeps on while nothing is pending.
    arrived: Condvar,
    /// Whether the scanner is asleep (or about to be) on `arrived`: a registration notifies only then.
    asleep: AtomicBool,
}

#[derive(Default)]
struct Shared {
    /// Registered and not yet taken by the scanner.
    incoming: Vec<Watch>,
    /// Words of the chunks that no write is pending on.
    free: Vec<&'static AtomicU32>,
    /// The chunks' first words, for registering them again (see [`Reactor::register_chunks`]).
    chunks: Vec<&'static [AtomicU32]>,
    /// The value the next flag waits for; never 0, which a word is set to before it is lent.
    next_value: u32,
    /// Whether the scanner thread runs.
    started: bool,
}

/// What a future and the scanner share: the outcome once known, and whom to wake.
pub(crate) struct Signal {
    state: Mutex<SignalState>,
}

#[derive(Default)]
struct SignalState {
    outcome: Option<Result<()>>,
    waker: Option<Waker>,
    /// The future is gone: nobody to tell.
    dropped: bool,
}

/// One pending point, as the scanner watches it.
struct Watch {
    signal: Arc<Signal>,
    on: On,
}

enum On {
    /// A word of a chunk that `stream` writes `value` to once the work queued before has completed. The stream
    /// is kept for the health check (and its context with it).
    Flag {
        word: &'static AtomicU32,
        value: u32,
        stream: Stream,
    },
    /// A completion the scanner asks the driver about: `Ok(true)` once complete.
    Query(Box<dyn FnMut() -> Result<bool> + Send>),
}

/// Where a future's point is, for its own look before it sleeps ([`Signal::flag_landed`]).
#[derive(Clone, Copy)]
pub(crate) struct FlagRef {
    word: &'static AtomicU32,
    value: u32,
}

impl FlagRef {
    /// Whether the stream's write has landed.
    pub(crate) fn landed(self) -> bool {
        self.word.load(Ordering::Acquire) == self.value
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Signal {
    /// The outcome if known, else `waker` kept to be woken with it.
    pub(crate) fn poll(&self, waker: &Waker) -> Option<Result<()>> {
        let mut state = lock(&self.state);
        if let Some(outcome) = state.outcome.take() {
            return Some(outcome);
        }
        match &mut state.waker {
            Some(kept) if kept.will_wake(waker) => {}
            kept => *kept = Some(waker.clone()),
        }
        None
    }

    /// The future is gone: the scanner stops telling it, and drops a query at its next pass.
    pub(crate) fn drop_future(&self) {
        let mut state = lock(&self.state);
        state.dropped = true;
        state.waker = None;
    }

    /// Whether the outcome is known (for a future that spins before it sleeps).
    pub(crate) fn is_finished(&self) -> bool {
        lock(&self.state).outcome.is_some()
    }

    fn is_dropped(&self) -> bool {
        lock(&self.state).dropped
    }

    /// Ends the wait with `outcome` and wakes the future, if it is still there.
    fn finish(&self, outcome: Result<()>) {
        let waker = {
            let mut state = lock(&self.state);
            if state.dropped {
                return;
            }
            state.outcome = Some(outcome);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Reactor {
    /// Watches for the work queued on `stream` so far to complete: a flag the stream writes, else an event the
    /// scanner queries. Returns what the future shares with the scanner, and the flag if it is one.
    ///
    /// # Errors
    /// The driver's, from queueing the write and then from recording the event; the scanner thread's failure
    /// to start.
    pub(crate) fn watch_stream(
        &'static self,
        stream: &Stream,
    ) -> Result<(Arc<Signal>, Option<FlagRef>)> {
        let signal = Arc::new(Signal {
            state: Mutex::new(SignalState::default()),
        });
        let flag = match self.write_flag(stream) {
            Ok(flag) => {
                self.add(Watch {
                    signal: signal.clone(),
                    on: On::Flag {
                        word: flag.word,
                        value: flag.value,
                        stream: stream.clone(),
                    },
                })?;
                Some(flag)
            }
            Err(_) => {
                // The stream cannot write the flag: an event recorded on it instead. A context with a sticky
                // error fails here too, with its error.
                let event = PooledEvent::record(stream.context(), stream.as_raw())?;
                self.add(Watch {
                    signal: signal.clone(),
                    on: On::Query(Box::new(move || event.query())),
                })?;
                None
            }
        };
        Ok((signal, flag))
    }

    /// Watches for `complete` (a query of the driver, `Ok(true)` once the point has completed) to hold; the
    /// scanner calls it once a pass, and drops it once it holds, fails, or the future is gone.
    ///
    /// # Errors
    /// The scanner thread's failure to start.
    pub(crate) fn watch_query(
        &'static self,
        complete: impl FnMut() -> Result<bool> + Send + 'static,
    ) -> Result<Arc<Signal>> {
        let signal = Arc::new(Signal {
            state: Mutex::new(SignalState::default()),
        });
        self.add(Watch {
            signal: signal.clone(),
            on: On::Query(Box::new(complete)),
        })?;
        Ok(signal)
    }

    /// Lends a word, set to 0, and queues on `stream` the write of its value. On failure the word is free again.
    fn write_flag(&'static self, stream: &Stream) -> Result<FlagRef> {
        let flag = self.lend(stream)?;
        // Queued under the device's gate, as all of the crate's work is, so that the release thread never finds
        // the device idle just before the write is queued (its unpinning would wait for the write).
        let _gate = stream.context().enqueue_gate();
        let write = |flag: FlagRef| {
            // SAFETY: a word of a chunk, aligned, never freed, page-locked by its registration, and lent to
            // this future alone until its write has landed (`scan` takes it back only then, or never).
            unsafe { calls::stream_write_value32(stream.as_raw(), address(flag.word), flag.value) }
        };
        let mut written = write(flag);
        if written
            .as_ref()
            .is_err_and(|e| e.driver_code() == Some(CUresult::CUDA_ERROR_INVALID_VALUE))
        {
            // The chunk's registration went with the context that made it (a primary context released by
            // every user and made again): registered again, through this stream's context.
            written = self.register_chunks(stream).and_then(|()| write(flag));
        }
        if let Err(e) = written {
            lock(&self.shared).free.push(flag.word);
            return Err(e.context("queueing the write of a completion flag"));
        }
        Ok(flag)
    }

    /// A free word, set to 0, with the value its write will carry; a new chunk (registered through `stream`'s
    /// context) when none is free.
    fn lend(&'static self, stream: &Stream) -> Result<FlagRef> {
        let mut shared = lock(&self.shared);
        if shared.free.is_empty() {
            let chunk = new_chunk(stream)?;
            shared.chunks.push(chunk);
            shared.free.extend(chunk.iter().rev());
        }
        let word = shared.free.pop().expect("a chunk was just added");
        shared.next_value = shared.next_value.wrapping_add(1).max(1);
        let value = shared.next_value;
        // No write is pending on a free word, and the stream's write is queued after this store.
        word.store(0, Ordering::Relaxed);
        Ok(FlagRef { word, value })
    }

    /// Registers every chunk again, through `stream`'s context; a chunk still registered is left so.
    fn register_chunks(&self, stream: &Stream) -> Result<()> {
        let chunks = lock(&self.shared).chunks.clone();
        let _current = stream.context().enter()?;
        for chunk in chunks {
            // SAFETY: a chunk of `new_chunk`, never freed.
            match unsafe { register(chunk) } {
                Err(e)
                    if e.driver_code()
                        != Some(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) =>
                {
                    return Err(e);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Hands `watch` to the scanner, starting it the first time, and wakes it if it sleeps.
    fn add(&'static self, watch: Watch) -> Result<()> {
        let mut shared = lock(&self.shared);
        if !shared.started {
            std::thread::Builder::new()
                .name("cuda-pinned-reactor".into())
                .spawn(move || self.scan())
                .map_err(|e| {
                    Error::invalid(format_args!(
                        "cannot start the thread that watches device work for futures: {e}"
                    ))
                })?;
            shared.started = true;
        }
        shared.incoming.push(watch);
        drop(shared);
        if self.asleep.load(Ordering::SeqCst) {
            // Taken so that the notification cannot fall between the scanner's look at `incoming` and its sleep.
            let _shared = lock(&self.shared);
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// The scanner thread's loop (see the module docs). It never ends: the process's reactor lives as long as
    /// the process, asleep while nothing is pending.
    fn scan(&'static self) {
        let mut active: Vec<Watch> = Vec::new();
        let mut returned: Vec<&'static AtomicU32> = Vec::new();
        let mut last_progress = Instant::now();
        let mut last_health = Instant::now();
        loop {
            {
                let mut shared = lock(&self.shared);
                shared.free.append(&mut returned);
                if active.is_empty() && shared.incoming.is_empty() {
                    self.asleep.store(true, Ordering::SeqCst);
                    while shared.incoming.is_empty() {
                        shared = self
                            .arrived
                            .wait(shared)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    self.asleep.store(false, Ordering::SeqCst);
                }
                if !shared.incoming.is_empty() {
                    active.append(&mut shared.incoming);
                    last_progress = Instant::now();
                }
            }
            let before = active.len();
            active.retain_mut(|watch| match check(watch) {
                None => true,
                Some(outcome) => {
                    if let On::Flag { word, .. } = watch.on {
                        returned.push(word);
                    }
                    if let Some(outcome) = outcome {
                        watch.signal.finish(outcome);
                    }
                    false
                }
            });
            if last_health.elapsed() >= HEALTH {
                fail_faulted(&mut active);
                last_health = Instant::now();
            }
            if active.len() < before {
                last_progress = Instant::now();
            }
            let waited = last_progress.elapsed();
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }
}

/// Whether `watch` is over: `None` while pending; `Some(None)` when it ends with nobody to tell (a query whose
/// future is gone; a flag that landed for a gone future); `Some(Some(outcome))` to tell its future.
fn check(watch: &mut Watch) -> Option<Option<Result<()>>> {
    match &mut watch.on {
        On::Flag { word, value, .. } => {
            (word.load(Ordering::Acquire) == *value).then_some(Some(Ok(())))
        }
        On::Query(complete) => {
            if watch.signal.is_dropped() {
                return Some(None);
            }
            match complete() {
                Ok(false) => None,
                Ok(true) => Some(Some(Ok(()))),
                Err(e) => Some(Some(Err(e.context("waiting for device work for a future")))),
            }
        }
    }
}

/// Ends, with their stream's error, the flags whose stream fails a query (a sticky error of its context): one
/// query per context with flags pending, and one per such stream where that fails. Their words stay lent.
fn fail_faulted(active: &mut Vec<Watch>) {
    let mut contexts: Vec<(CUcontext, bool)> = Vec::new();
    let mut streams: Vec<(CUstream, Option<Error>)> = Vec::new();
    let mut error_of = |stream: &Stream| {
        if let Some((_, error)) = streams.iter().find(|(s, _)| *s == stream.as_raw()) {
            return error.clone();
        }
        let error = stream.query().err();
        streams.push((stream.as_raw(), error.clone()));
        error
    };
    active.retain(|watch| {
        let On::Flag { stream, .. } = &watch.on else {
            return true;
        };
        let context = stream.context().as_raw();
        let healthy = match contexts.iter().find(|(c, _)| *c == context) {
            Some(&(_, healthy)) => healthy,
            None => {
                let healthy = error_of(stream).is_none();
                contexts.push((context, healthy));
                healthy
            }
        };
        if healthy {
            return true;
        }
        let Some(e) = error_of(stream) else {
            return true;
        };
        watch
            .signal
            .finish(Err(e.context("waiting for device work for a future")));
        false
    });
}

/// A word's address as the device sees it: its host address (page-locked memory under unified addressing).
fn address(word: &AtomicU32) -> CUdeviceptr {
    std::ptr::from_ref(word) as CUdeviceptr
}

/// A new chunk of [`CHUNK`] zeroed words, page-aligned, registered through `stream`'s context; never freed
/// (a write may be pending on it, and it may be registered).
fn new_chunk(stream: &Stream) -> Result<&'static [AtomicU32]> {
    let layout = std::alloc::Layout::from_size_align(CHUNK * size_of::<AtomicU32>(), PAGE)
        .expect("a valid layout");
    // SAFETY: a layout of non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(Error::invalid(format_args!(
            "out of host memory for {} bytes of completion flags",
            layout.size()
        )));
    }
    // SAFETY: `layout`'s bytes at `ptr`, zeroed (a valid AtomicU32 each), aligned for it, never freed below
    // unless the registration fails (then nothing else has seen them).
    let chunk = unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU32>(), CHUNK) };
    let registered = stream
        .context()
        .enter()
        // SAFETY: the chunk just allocated, never freed once registered.
        .and_then(|_current| unsafe { register(chunk) });
    if let Err(e) = registered {
        // SAFETY: allocated above with `layout`; nothing refers to it.
        unsafe { std::alloc::dealloc(ptr, layout) };
        return Err(e.context("page-locking completion flags"));
    }
    Ok(chunk)
}

/// Page-locks `chunk` for every context (portable, mapped).
///
/// # Safety
/// `chunk` must never be freed.
unsafe fn register(chunk: &'static [AtomicU32]) -> Result<()> {
    // SAFETY: the chunk's bytes, which stay allocated (see above).
    unsafe {
        calls::mem_host_register(
            chunk.as_ptr().cast_mut().cast(),
            size_of_val(chunk),
            CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
        )
    }
}
