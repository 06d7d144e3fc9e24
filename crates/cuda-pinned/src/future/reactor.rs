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

#![allow(unsafe_code)]

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::driver::calls;
use crate::driver::marks::PooledEvent;
use crate::driver::{Context, Stream};
use crate::error::{Error, Result};
use crate::sync::flags::{FlagRef, Hub, On, Scanner, Signal, Watch};
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
    REACTOR.get_or_init(|| Reactor { hub: Hub::new() })
}

/// The bookkeeping (`flags.rs`), the flags' words kept alive by their devices' contexts.
pub(crate) struct Reactor {
    hub: Hub<Context>,
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
                keep: context.clone(),
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
                self.hub.refuse(device, e.clone());
            }
        }
        if let Err(e) = written {
            self.hub.give_back(device, flag.word);
            return Err(e.context("queueing the write of a completion flag"));
        }
        Ok(flag)
    }

    /// A free word of `device`, set to 0, with the value its write will carry; a new chunk (registered through
    /// `stream`'s context) when none is free.
    fn lend(&'static self, stream: &Stream, device: usize) -> Result<FlagRef> {
        self.hub.lend(device, || new_chunk(stream))
    }

    /// Registers `device`'s chunks again, through `stream`'s context; a chunk still registered is left so.
    fn register_chunks(&self, stream: &Stream, device: usize) -> Result<()> {
        let chunks = self.hub.chunks(device);
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

    /// Hands `watch` to the scanner, starting it the first time.
    fn add(&'static self, watch: Watch<Context>) -> Result<()> {
        self.hub.add(watch, || {
            std::thread::Builder::new()
                .name("cuda-pinned-reactor".into())
                .spawn(move || self.run())
                .map(drop)
                .map_err(|e| {
                    Error::invalid(format_args!(
                        "cannot start the thread that watches device work for futures: {e}"
                    ))
                })
        })
    }

    /// The scanner thread's loop (see the module docs). It never ends: the process's reactor lives as long as
    /// the process, asleep while nothing is pending.
    fn run(&'static self) {
        let mut scanner = Scanner::default();
        let mut last_progress = Instant::now();
        let mut last_query = Instant::now();
        let mut last_health = Instant::now();
        loop {
            if scanner.take(&self.hub) {
                last_progress = Instant::now();
            }
            let query = last_query.elapsed() >= QUERY_EVERY;
            if query {
                last_query = Instant::now();
            }
            if scanner.pass(query) > 0 {
                last_progress = Instant::now();
            }
            if last_health.elapsed() >= HEALTH {
                fail_faulted(&mut scanner);
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
}

/// Ends, with its error, the flags of every context whose stream for frees fails a query (a sticky error):
/// one query per context with flags pending. Their words stay lent.
fn fail_faulted(scanner: &mut Scanner<Context>) {
    let mut contexts: Vec<(CUcontext, Option<Error>)> = Vec::new();
    scanner.active.retain(|watch| {
        let On::Flag { keep: context, .. } = &watch.on else {
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
