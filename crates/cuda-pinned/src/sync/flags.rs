//! The reactor's bookkeeping (see `future/reactor.rs`), apart from the driver: the flag words lent and taken back, the
//! futures' signals, the hand-over of new watches to the scanner thread, and the scanner's pass. A word is lent
//! to one future at a time ([`Hub::lend`]), set to 0 and then written by its stream with a value of its own;
//! the scanner takes it back ([`Scanner::pass`], [`Scanner::take`]) only once that value has landed, so a word
//! read never answers for another future and no write is pending on a word lent again.
//!
//! Written against `primitives.rs`, so that the model check (`model/`) runs this file over loom's primitives,
//! with a thread standing in for the device's writes.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, PoisonError};
use std::task::Waker;

use super::primitives::{AtomicBool, AtomicU32, Condvar, Mutex, MutexGuard, Ordering};
use crate::error::{Error, Result};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a future's point is: a lent word and the value its stream writes there.
#[derive(Clone, Copy)]
pub(crate) struct FlagRef {
    pub(crate) word: &'static AtomicU32,
    pub(crate) value: u32,
}

impl FlagRef {
    /// Whether the stream's write has landed.
    pub(crate) fn landed(self) -> bool {
        self.word.load(Ordering::Acquire) == self.value
    }
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

impl Signal {
    pub(crate) fn new() -> Arc<Signal> {
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
    pub(crate) fn finish(&self, outcome: Result<()>) {
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

/// One pending point, as the scanner watches it; `K` is what keeps a flag's registration alive (a context).
pub(crate) struct Watch<K> {
    pub(crate) signal: Arc<Signal>,
    pub(crate) on: On<K>,
}

pub(crate) enum On<K> {
    /// A word of device `device`'s flags that a stream writes `value` to once the work queued before it has
    /// completed; `keep` keeps the word's registration (and is what the reactor checks for a sticky error).
    Flag {
        word: &'static AtomicU32,
        value: u32,
        device: usize,
        keep: K,
    },
    /// A completion the scanner asks the driver about: `Ok(true)` once complete. Queries with one `key` (an
    /// event's handle) are asked once per round for all of them.
    Query {
        key: usize,
        complete: Box<dyn FnMut() -> Result<bool> + Send>,
    },
}

/// The flags of one device's streams.
#[derive(Default)]
struct Flags {
    chunks: Vec<&'static [AtomicU32]>,
    /// Words no write is pending on.
    free: Vec<&'static AtomicU32>,
    /// The device's streams could not write a word: its points are events from now on.
    refused: Option<Error>,
}

struct Shared<K> {
    /// Registered and not yet taken by the scanner.
    incoming: Vec<Watch<K>>,
    /// Each device's flags, by ordinal.
    devices: Vec<Flags>,
    /// The value the next flag waits for; never 0, which a word is set to before it is lent.
    next_value: u32,
    /// Whether the scanner thread runs.
    started: bool,
}

/// What the threads that register watches share with the scanner.
pub(crate) struct Hub<K> {
    shared: Mutex<Shared<K>>,
    /// What the scanner sleeps on while nothing is pending.
    arrived: Condvar,
    /// Whether the scanner is asleep (or about to be) on `arrived`: a registration notifies only then.
    asleep: AtomicBool,
}

impl<K> Hub<K> {
    pub(crate) fn new() -> Hub<K> {
        Hub {
            shared: Mutex::new(Shared {
                incoming: Vec::new(),
                devices: Vec::new(),
                next_value: 0,
                started: false,
            }),
            arrived: Condvar::new(),
            asleep: AtomicBool::new(false),
        }
    }

    /// A free word of `device`, set to 0, with the value its write will carry; from a new chunk of
    /// `new_chunk` (zeroed words, which must stay allocated for good) when none is free.
    ///
    /// # Errors
    /// The device's refusal ([`Hub::refuse`]) or `new_chunk`'s.
    pub(crate) fn lend(
        &self,
        device: usize,
        new_chunk: impl FnOnce() -> Result<&'static [AtomicU32]>,
    ) -> Result<FlagRef> {
        let mut shared = lock(&self.shared);
        if shared.devices.len() <= device {
            shared.devices.resize_with(device + 1, Flags::default);
        }
        let flags = &mut shared.devices[device];
        if let Some(e) = &flags.refused {
            return Err(e.clone());
        }
        if flags.free.is_empty() {
            let chunk = new_chunk()?;
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

    /// Takes back a word whose write was never queued.
    pub(crate) fn give_back(&self, device: usize, word: &'static AtomicU32) {
        lock(&self.shared).devices[device].free.push(word);
    }

    /// From now on `device`'s points are not flags: [`Hub::lend`] fails with `error`.
    pub(crate) fn refuse(&self, device: usize, error: Error) {
        lock(&self.shared).devices[device].refused = Some(error);
    }

    /// Every chunk of `device`'s.
    pub(crate) fn chunks(&self, device: usize) -> Vec<&'static [AtomicU32]> {
        lock(&self.shared).devices[device].chunks.clone()
    }

    /// Hands `watch` to the scanner, calling `start` (which starts the scanner) the first time, and wakes the
    /// scanner if it sleeps.
    ///
    /// # Errors
    /// `start`'s; the watch is then not added.
    pub(crate) fn add(&self, watch: Watch<K>, start: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut shared = lock(&self.shared);
        if !shared.started {
            start()?;
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
pub(crate) struct Scanner<K> {
    pub(crate) active: Vec<Watch<K>>,
    /// Words whose write landed, by device, to give back at the next [`Scanner::take`].
    returned: Vec<(usize, &'static AtomicU32)>,
    /// The answers of one round of queries, by key.
    answers: HashMap<usize, Result<bool>>,
}

impl<K> Default for Scanner<K> {
    fn default() -> Scanner<K> {
        Scanner {
            active: Vec::new(),
            returned: Vec::new(),
            answers: HashMap::new(),
        }
    }
}

impl<K> Scanner<K> {
    /// Gives back the words whose writes landed, sleeps while nothing is pending, and takes the new watches.
    /// Whether there were any.
    pub(crate) fn take(&mut self, hub: &Hub<K>) -> bool {
        let mut shared = lock(&hub.shared);
        for (device, word) in self.returned.drain(..) {
            shared.devices[device].free.push(word);
        }
        if self.active.is_empty() && shared.incoming.is_empty() {
            hub.asleep.store(true, Ordering::SeqCst);
            while shared.incoming.is_empty() {
                shared = hub
                    .arrived
                    .wait(shared)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            hub.asleep.store(false, Ordering::SeqCst);
        }
        let arrived = !shared.incoming.is_empty();
        self.active.append(&mut shared.incoming);
        arrived
    }

    /// One pass: every flag read, and with `query` every query asked (a new round of answers); ends what is
    /// over. How many were.
    pub(crate) fn pass(&mut self, query: bool) -> usize {
        if query {
            self.answers.clear();
        }
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
        before - self.active.len()
    }
}
