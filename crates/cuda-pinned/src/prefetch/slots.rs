//! The prefetcher's bookkeeping as a pure state machine: which slots are free, being filled, filled and
//! waiting to be delivered, or held by the consumer; the reorder buffer; which position goes out next; the end
//! of the stream and errors. No threads and no FFI: the prefetcher calls it under one mutex, and the tests
//! drive it through random interleavings on any machine.
//!
//! Batches are numbered by *position*, their place in the stream (0, 1, 2, ...); the prefetcher maps a
//! position to the user's batch index. Positions go to workers in increasing order, one slot each. A worker
//! hands its slot back with the outcome; an `Ok` slot waits in the reorder buffer until the consumer takes it
//! (in position order, or in completion order when unordered), an `Err` gives its slot back at once and waits
//! in the buffer in the slot's place.
//!
//! Why ordered delivery cannot deadlock: the lowest position not yet delivered is always either being filled
//! (it holds a slot) or in the buffer, because positions go out in order and each takes a slot. So while the
//! consumer holds fewer than all the slots, either something is ready, or a worker is filling the next batch,
//! or a slot is free for one to start it. When the consumer holds them all, [`Take::AllHeld`] says so instead
//! of waiting forever.
//!
//! Errors end the stream: in order, the batches before the failed position are still delivered, then the
//! error in its place, then the end; batches after it are dropped (their slots freed) and no further position
//! goes out. Unordered, the error is delivered after the batches that completed before it, then the end.

use std::collections::BTreeMap;

/// The prefetcher's slots and stream positions. `S` is a slot (moved in and out), `E` an error.
#[derive(Debug)]
pub(crate) struct Slots<S, E> {
    /// The slots in all: free, filling, ready and held. Fixed once built.
    count: usize,
    /// The positions of the stream: `0..total`.
    total: usize,
    /// Deliver in position order (else in completion order).
    ordered: bool,
    /// Slots no one uses, ready to be filled.
    free: Vec<S>,
    /// Positions handed to workers so far: the next one to hand out.
    assigned: usize,
    /// Slots workers hold.
    filling: usize,
    /// Completed positions not yet delivered, keyed by position (ordered) or completion number (unordered),
    /// with their position. An `Err` holds no slot.
    ready: BTreeMap<usize, (usize, Result<S, E>)>,
    /// Completions so far: the key of the next one when unordered.
    completions: usize,
    /// Positions delivered (ordered: also the next one to deliver).
    delivered: usize,
    /// Slots the consumer holds.
    held: usize,
    /// No position at or past this is handed out or delivered: `total`, or just past the failed position.
    end: usize,
    /// An error has completed: no position is handed out any more, and (unordered) later completions are
    /// dropped.
    failed: bool,
    /// The consumer has seen the end (everything delivered, or the error).
    finished: bool,
    /// The prefetcher is gone: slots that come back are the caller's to drop.
    stopped: bool,
}

/// What a worker should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Assign<S> {
    /// Fill `slot` with the batch at `position`.
    Fill {
        /// A free slot, now the worker's.
        slot: S,
        /// The position to build.
        position: usize,
    },
    /// No slot is free: wait for one to come back.
    Wait,
    /// Nothing is left to build (every position handed out, an error, or the prefetcher stopped): exit.
    Done,
}

/// What the consumer gets next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take<S, E> {
    /// The batch at `position`, in `slot`, now the consumer's.
    Batch {
        /// The filled slot.
        slot: S,
        /// Its position.
        position: usize,
    },
    /// Building the batch at `position` failed; the stream ends after it.
    Failed {
        /// The failed position.
        position: usize,
        /// Why.
        error: E,
    },
    /// Nothing is ready yet, but something will be: wait for a completion.
    Wait,
    /// The consumer holds every slot, so nothing can be built: it must give one back first.
    AllHeld,
    /// The stream has ended.
    End,
}

/// Where the slots are, for `Debug` and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Slots no one uses.
    pub(crate) free: usize,
    /// Slots workers hold.
    pub(crate) filling: usize,
    /// Filled slots waiting for the consumer.
    pub(crate) ready: usize,
    /// Slots the consumer holds.
    pub(crate) held: usize,
    /// Positions delivered so far.
    pub(crate) delivered: usize,
}

impl<S, E> Slots<S, E> {
    /// The bookkeeping of a stream of `total` positions over `slots`, all free.
    pub(crate) fn new(slots: Vec<S>, total: usize, ordered: bool) -> Slots<S, E> {
        Slots {
            count: slots.len(),
            total,
            ordered,
            free: slots,
            assigned: 0,
            filling: 0,
            ready: BTreeMap::new(),
            completions: 0,
            delivered: 0,
            held: 0,
            end: total,
            failed: false,
            finished: false,
            stopped: false,
        }
    }

    /// The number of slots.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The number of positions in the stream.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// The next position for a worker and a free slot to build it in.
    pub(crate) fn assign(&mut self) -> Assign<S> {
        if self.stopped || self.failed || self.assigned >= self.end {
            return Assign::Done;
        }
        let Some(slot) = self.free.pop() else {
            return Assign::Wait;
        };
        let position = self.assigned;
        self.assigned += 1;
        self.filling += 1;
        Assign::Fill { slot, position }
    }

    /// A worker is done with `position`: `Ok(slot)` filled, or `Err((slot, error))`. Returns the slot when the
    /// caller must drop it (the prefetcher has stopped); otherwise the machine keeps it.
    pub(crate) fn complete(&mut self, position: usize, outcome: Result<S, (S, E)>) -> Option<S> {
        assert!(
            self.filling > 0 && position < self.assigned,
            "prefetch: a completion for position {position}, which no worker was filling"
        );
        self.filling -= 1;
        let (slot, error) = match outcome {
            Ok(slot) => (slot, None),
            Err((slot, error)) => (slot, Some(error)),
        };
        if self.stopped {
            return Some(slot);
        }
        let wanted = if self.ordered {
            position < self.end
        } else {
            !self.failed
        };
        if !wanted {
            // Past an error: never delivered.
            self.free.push(slot);
            return None;
        }
        let key = self.key(position);
        match error {
            None => {
                self.ready.insert(key, (position, Ok(slot)));
            }
            Some(error) => {
                self.free.push(slot);
                self.failed = true;
                if self.ordered {
                    // The stream ends after this position: what was built past it goes back.
                    self.end = position + 1;
                    for (_, (_, past)) in self.ready.split_off(&self.end) {
                        if let Ok(slot) = past {
                            self.free.push(slot);
                        }
                    }
                }
                self.ready.insert(key, (position, Err(error)));
            }
        }
        None
    }

    /// The next batch for the consumer, or why there is none.
    pub(crate) fn take(&mut self) -> Take<S, E> {
        if self.finished {
            return Take::End;
        }
        let next = if self.ordered {
            self.ready.first_key_value().map(|(&key, _)| key) == Some(self.delivered)
        } else {
            !self.ready.is_empty()
        };
        if next {
            let (_, (position, outcome)) = self
                .ready
                .pop_first()
                .expect("prefetch: the reorder buffer's first entry vanished");
            self.delivered += 1;
            return match outcome {
                Ok(slot) => {
                    self.held += 1;
                    Take::Batch { slot, position }
                }
                Err(error) => {
                    self.finished = true;
                    Take::Failed { position, error }
                }
            };
        }
        if self.delivered >= self.end {
            self.finished = true;
            return Take::End;
        }
        if self.held == self.count {
            return Take::AllHeld;
        }
        Take::Wait
    }

    /// The consumer is done with a slot. Returns it when the caller must drop it (the prefetcher has
    /// stopped); otherwise it is free again.
    pub(crate) fn give_back(&mut self, slot: S) -> Option<S> {
        assert!(
            self.held > 0,
            "prefetch: a slot given back that the consumer did not hold"
        );
        self.held -= 1;
        if self.stopped {
            return Some(slot);
        }
        self.free.push(slot);
        None
    }

    /// Stops the stream: workers get [`Assign::Done`], and slots that come back from now on are the caller's
    /// to drop. Returns the slots the machine holds (free and ready), for the caller to drop.
    pub(crate) fn stop(&mut self) -> Vec<S> {
        self.stopped = true;
        let mut slots = std::mem::take(&mut self.free);
        slots.extend(
            std::mem::take(&mut self.ready)
                .into_values()
                .filter_map(|(_, outcome)| outcome.ok()),
        );
        slots
    }

    /// Where the slots are now.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            free: self.free.len(),
            filling: self.filling,
            ready: self.ready_slots(),
            held: self.held,
            delivered: self.delivered,
        }
    }

    fn ready_slots(&self) -> usize {
        self.ready.values().filter(|(_, r)| r.is_ok()).count()
    }

    /// The reorder buffer's key for a completion at `position`.
    fn key(&mut self, position: usize) -> usize {
        if self.ordered {
            position
        } else {
            self.completions += 1;
            self.completions - 1
        }
    }

    /// Panics unless the machine's invariants hold: every slot is in exactly one place, and the reorder
    /// buffer holds only positions that may still be delivered.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let c = self.counts();
        if !self.stopped {
            assert_eq!(c.free + c.filling + c.ready + c.held, self.count, "{c:?}");
        }
        assert!(c.filling + c.ready + c.held <= self.count, "{c:?}");
        assert!(self.assigned <= self.total && self.end <= self.total);
        assert!(self.delivered <= self.assigned);
        for (&key, &(position, _)) in &self.ready {
            assert!(position < self.assigned);
            if self.ordered {
                assert_eq!(key, position);
                assert!(key >= self.delivered && key < self.end, "{key}");
            }
        }
        assert!(self.ready.values().filter(|(_, r)| r.is_err()).count() <= 1);
    }
}
