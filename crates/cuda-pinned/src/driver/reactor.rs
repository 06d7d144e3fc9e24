//! The reactor: one thread of the crate's that learns when device work has completed and wakes the futures
//! waiting for it ([`super::done::Done`]), so that no executor thread ever blocks in a driver call.
//!
//! A future's point in a stream is a *flag*: a word of page-locked host memory that the stream itself writes
//! (`cuStreamWriteValue32_v2`) once the work queued before it has completed. The words live in chunks of
//! [`CHUNK`] words that the reactor allocates and never frees, each registered with the driver through a context
//! of one device and lent only to that device's streams: a future's watch keeps that device's context (so the
//! registration) alive until its write lands. A word is lent to one future at a time and taken back only after
//! its write has landed, and each write carries a value of its own, so a word read never answers for another
//! future. Reading a word costs the scanner nothing a driver call would: one pass over many thousands of pending
//! flags is a pass over memory. Where a device's streams cannot write (a driver without stream memory
//! operations, memory the driver refuses), and for points that are events (an [`Event`](super::Event), a closed
//! segment a buffer's tracker waits for), the scanner queries an event instead: every [`QUERY_EVERY`], once per
//! event however many futures wait for it.
//!
//! The scanner sleeps while nothing is pending and is woken by the registration that makes something pending.
//! While something is, it passes over the flags without pause for [`SPIN`] after the last completion or
//! registration, then yields the processor between passes until [`YIELD`], then naps [`NAP`] between passes:
//! a future whose work completes soon is woken within a pass, one that waits long costs a core little.
//!
//! A stream's flag never lands after its context takes a sticky error (a kernel that traps): so every
//! [`HEALTH`] the scanner queries the crate's own stream of each context with flags pending (its stream for
//! frees, which a sticky error fails like every other), and ends the futures of a failed context with the error.
//! Their words stay lent: whether a write queued in a failed context can still land is not known.
//!
//! The only code of others the thread runs is a waker's `wake`; one that panics is caught, and the thread goes
//! on for every other future.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;
use std::time::{Duration, Instant};

use super::calls;
use super::context::Context;
use super::marks::PooledEvent;
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::sys::{
    CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE, CUcontext, CUdeviceptr, CUresult,
};

/// Words per chunk of flags: 64 KiB, aligned to 64 KiB, so that a chunk shares no page with other memory
/// whatever the host's page size (4 KiB, or 64 KiB on some Arm hosts).
const CHUNK: usize = 16 << 10;
const CHUNK_ALIGN: usize = 64 << 10;
/// How long the scanner passes without pause after the last completion or registration.
const SPIN: Duration = Duration::from_micros(200);
/// Until when, after that, it yields between passes.
const YIELD: Duration = Duration::from_millis(2);
/// How long it naps between passes after that.
const NAP: Duration = Duration::from_micros(20);
/// How often it queries the events that futures wait for.
const QUERY_EVERY: Duration = Duration::from_micros(20);
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
    /// Each device's flags, by ordinal.
    devices: Vec<Flags>,
    /// The value the next flag waits for; never 0, which a word is set to before it is lent.
    next_value: u32,
    /// Whether the scanner thread runs.
    started: bool,
}

/// The flags of one device's streams.
#[derive(Default)]
struct Flags {
    chunks: Vec<&'static [AtomicU32]>,
    /// Words no write is pending on.
    free: Vec<&'static AtomicU32>,
    /// The device's streams could not write a word even after its chunks were registered again: its points are
    /// events from now on.
    refused: Option<Error>,
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
    /// A word of device `device`'s chunks that a stream of `context` writes `value` to once the work queued
    /// before has completed. The context keeps the chunk's registration, and the stream queried for its health.
    Flag {
        word: &'static AtomicU32,
        value: u32,
        device: usize,
        context: Context,
    },
    /// A completion the scanner asks the driver about: `Ok(true)` once complete. Queries with one `key` (an
    /// event's handle) are asked once per round for all of them.
    Query {
        key: usize,
        complete: Box<dyn FnMut() -> Result<bool> + Send>,
    },
}

/// Where a future's point is, for its own look before it sleeps ([`FlagRef::landed`]).
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
    fn new() -> Arc<Signal> {
        Arc::new(Signal {
            state: Mutex::new(SignalState::default()),
        })
    }

    /// The outcome if known, else `waker` kept to be woken with it.
    pub(crate) fn poll(&self, waker: &Waker) -> Option<Result<()>> {
        let replaced = {
            let mut state = lock(&self.state);
            if let Some(outcome) = state.outcome.take() {
                return Some(outcome);
            }
            match &mut state.waker {
                Some(kept) if kept.will_wake(waker) => None,
                kept => kept.replace(waker.clone()),
            }
        };
        // Dropped without the lock: a waker's drop is others' code, and may drop this very future.
        drop(replaced);
        None
    }

    /// Whether the outcome is known (for a future that spins before it sleeps).
    pub(crate) fn is_finished(&self) -> bool {
        lock(&self.state).outcome.is_some()
    }

    /// The future is gone: the scanner stops telling it, and drops a query at its next round.
    pub(crate) fn drop_future(&self) {
        let waker = {
            let mut state = lock(&self.state);
            state.dropped = true;
            state.waker.take()
        };
        // Dropped without the lock: a waker's drop is others' code.
        drop(waker);
    }

    fn is_dropped(&self) -> bool {
        lock(&self.state).dropped
    }

    /// Ends the wait with `outcome` and wakes the future, if it is still there. A waker that panics is caught
    /// (the scanner serves every other future).
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
            let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
        }
    }
}

impl Reactor {
    /// Watches for the work queued on `stream` so far to complete: a flag the stream writes, else an event the
    /// scanner queries. Closes the stream's current segment first (see `marks.rs`): the write is work the
    /// crate's marks do not track. Returns what the future shares with the scanner, and the flag if it is one.
    ///
    /// # Errors
    /// The driver's, from closing the segment, queueing the write (then from recording the event), or making
    /// the context's stream for frees; the scanner thread's failure to start.
    pub(crate) fn watch_stream(
        &'static self,
        stream: &Stream,
    ) -> Result<(Arc<Signal>, Option<FlagRef>)> {
        let signal = Signal::new();
        let context = stream.context();
        // The stream the health check queries, made now rather than on the scanner's thread.
        context.release_stream()?;
        // Queued under the device's gate, as all of the crate's work is, so that the release thread never finds
        // the device idle just before (its unpinning would wait for the write); the segment locked from its
        // closing to the write, so that no operation of the crate lands in between.
        let _gate = context.enqueue_gate();
        let segment = stream.segment();
        // Checked under the segment lock, which a capture takes to begin: the flag is never captured.
        stream.refuse_in_capture("Stream::done")?;
        stream.close_segment()?;
        let on = match self.write_flag(stream) {
            Ok(flag) => On::Flag {
                word: flag.word,
                value: flag.value,
                device: context.device().ordinal(),
                context: context.clone(),
            },
            Err(_) => {
                // The stream cannot write the flag: an event recorded on it instead. A context with a sticky
                // error fails here too, with its error.
                let event = PooledEvent::record(context, stream.as_raw())?;
                On::Query {
                    key: event.as_raw() as usize,
                    complete: Box::new(move || event.query()),
                }
            }
        };
        drop(segment);
        let flag = match &on {
            On::Flag { word, value, .. } => Some(FlagRef {
                word,
                value: *value,
            }),
            On::Query { .. } => None,
        };
        self.add(Watch {
            signal: signal.clone(),
            on,
        })?;
        Ok((signal, flag))
    }

    /// Watches for `complete` (a query of the driver, `Ok(true)` once the point has completed) to hold; the
    /// scanner asks it every [`QUERY_EVERY`], once for all the queries of one `key` (an event's handle), and
    /// drops it once it holds, fails, or the future is gone.
    ///
    /// # Errors
    /// The scanner thread's failure to start.
    pub(crate) fn watch_query(
        &'static self,
        key: usize,
        complete: impl FnMut() -> Result<bool> + Send + 'static,
    ) -> Result<Arc<Signal>> {
        let signal = Signal::new();
        self.add(Watch {
            signal: signal.clone(),
            on: On::Query {
                key,
                complete: Box::new(complete),
            },
        })?;
        Ok(signal)
    }

    /// Lends a word of the stream's device, set to 0, and queues on `stream` the write of its value. On failure
    /// the word is free again.
    fn write_flag(&'static self, stream: &Stream) -> Result<FlagRef> {
        let device = stream.context().device().ordinal();
        let flag = self.lend(stream, device)?;
        let write = |flag: FlagRef| {
            // SAFETY: a word of a chunk, aligned, never freed, registered through a context of the stream's
            // device that the watch keeps alive until the write lands, and lent to this future alone until then
            // (`scan` takes it back only then, or never).
            unsafe { calls::stream_write_value32(stream.as_raw(), address(flag.word), flag.value) }
        };
        let mut written = write(flag);
        if written
            .as_ref()
            .is_err_and(|e| e.driver_code() == Some(CUresult::CUDA_ERROR_INVALID_VALUE))
        {
            // The chunks' registration went with the context that made it (the device's primary context
            // released by every user and made again): registered again, through this stream's context; if the
            // write fails again, the device's points are events from now on.
            written = self
                .register_chunks(stream, device)
                .and_then(|()| write(flag));
            if let Err(e) = &written {
                lock(&self.shared).devices[device].refused = Some(e.clone());
            }
        }
        if let Err(e) = written {
            lock(&self.shared).devices[device].free.push(flag.word);
            return Err(e.context("queueing the write of a completion flag"));
        }
        Ok(flag)
    }

    /// A free word of `device`, set to 0, with the value its write will carry; a new chunk (registered through
    /// `stream`'s context) when none is free.
    fn lend(&'static self, stream: &Stream, device: usize) -> Result<FlagRef> {
        let mut shared = lock(&self.shared);
        if shared.devices.len() <= device {
            shared.devices.resize_with(device + 1, Flags::default);
        }
        let flags = &mut shared.devices[device];
        if let Some(e) = &flags.refused {
            return Err(e.clone());
        }
        if flags.free.is_empty() {
            let chunk = new_chunk(stream)?;
            flags.chunks.push(chunk);
            flags.free.extend(chunk.iter().rev());
        }
        let word = flags.free.pop().expect("a chunk was just added");
        shared.next_value = shared.next_value.wrapping_add(1).max(1);
        let value = shared.next_value;
        // No write is pending on a free word, and the stream's write is queued after this store.
        word.store(0, Ordering::Relaxed);
        Ok(FlagRef { word, value })
    }

    /// Registers `device`'s chunks again, through `stream`'s context; a chunk still registered is left so.
    fn register_chunks(&self, stream: &Stream, device: usize) -> Result<()> {
        let chunks = lock(&self.shared).devices[device].chunks.clone();
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
                .spawn(move || Scanner::default().run(self))
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
}

/// The scanner thread's state.
#[derive(Default)]
struct Scanner {
    active: Vec<Watch>,
    /// Words whose write landed, by device, to give back at the next pass.
    returned: Vec<(usize, &'static AtomicU32)>,
    /// The answers of one round of queries, by key.
    answers: HashMap<usize, Result<bool>>,
}

impl Scanner {
    /// The thread's loop (see the module docs). It never ends: the process's reactor lives as long as the
    /// process, asleep while nothing is pending.
    fn run(mut self, reactor: &'static Reactor) {
        let mut last_progress = Instant::now();
        let mut last_query = Instant::now();
        let mut last_health = Instant::now();
        loop {
            {
                let mut shared = lock(&reactor.shared);
                for (device, word) in self.returned.drain(..) {
                    shared.devices[device].free.push(word);
                }
                if self.active.is_empty() && shared.incoming.is_empty() {
                    reactor.asleep.store(true, Ordering::SeqCst);
                    while shared.incoming.is_empty() {
                        shared = reactor
                            .arrived
                            .wait(shared)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    reactor.asleep.store(false, Ordering::SeqCst);
                }
                if !shared.incoming.is_empty() {
                    self.active.append(&mut shared.incoming);
                    last_progress = Instant::now();
                }
            }
            let query = last_query.elapsed() >= QUERY_EVERY;
            if query {
                self.answers.clear();
                last_query = Instant::now();
            }
            if self.pass(query) {
                last_progress = Instant::now();
            }
            if last_health.elapsed() >= HEALTH {
                self.fail_faulted();
                last_health = Instant::now();
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

    /// One pass: every flag read, and with `query` every query asked; ends what is over. Whether anything was.
    fn pass(&mut self, query: bool) -> bool {
        let before = self.active.len();
        let (returned, answers) = (&mut self.returned, &mut self.answers);
        self.active.retain_mut(|watch| {
            let outcome = match &mut watch.on {
                On::Flag {
                    word,
                    value,
                    device,
                    ..
                } => {
                    if word.load(Ordering::Acquire) != *value {
                        return true;
                    }
                    returned.push((*device, *word));
                    Ok(())
                }
                On::Query { key, complete } => {
                    if watch.signal.is_dropped() {
                        return false;
                    }
                    if !query {
                        return true;
                    }
                    let answer = answers.entry(*key).or_insert_with(complete);
                    match answer {
                        Ok(false) => return true,
                        Ok(true) => Ok(()),
                        Err(e) => Err(e.clone()),
                    }
                }
            };
            watch
                .signal
                .finish(outcome.map_err(|e| e.context("waiting for device work for a future")));
            false
        });
        self.active.len() < before
    }

    /// Ends, with its error, the flags of every context whose stream for frees fails a query (a sticky error):
    /// one query per context with flags pending. Their words stay lent.
    fn fail_faulted(&mut self) {
        let mut contexts: Vec<(CUcontext, Option<Error>)> = Vec::new();
        self.active.retain(|watch| {
            let On::Flag { context, .. } = &watch.on else {
                return true;
            };
            let raw = context.as_raw();
            let error = match contexts.iter().find(|(c, _)| *c == raw) {
                Some((_, error)) => error.clone(),
                None => {
                    let error = context.release_stream().and_then(calls::stream_query).err();
                    contexts.push((raw, error.clone()));
                    error
                }
            };
            let Some(e) = error else {
                return true;
            };
            watch
                .signal
                .finish(Err(e.context("waiting for device work for a future")));
            false
        });
    }
}

/// A word's address as the device sees it: its host address (page-locked memory under unified addressing).
fn address(word: &AtomicU32) -> CUdeviceptr {
    std::ptr::from_ref(word) as CUdeviceptr
}

/// A new chunk of [`CHUNK`] zeroed words, registered through `stream`'s context; never freed (a write may be
/// pending on it, and it may be registered).
fn new_chunk(stream: &Stream) -> Result<&'static [AtomicU32]> {
    let layout = std::alloc::Layout::from_size_align(CHUNK * size_of::<AtomicU32>(), CHUNK_ALIGN)
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

/// Page-locks `chunk` (portable, mapped).
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
