//! A simulated device for the CPU tests of the tracker and of the pool state: streams as FIFO queues that run
//! only when the test advances them, so the test picks the schedule.
//!
//! A use of memory enqueued on a stream carries a payload of the caller's type `U` (what it touches, how);
//! the simulator records on which stream each use was enqueued and whether it has executed, and calls
//! [`Payload::before_execute`] just before a use executes, so that a test can check what must have run
//! before it. A mark ([`Sim::mark`]) stands for the point right after the last use enqueued on a stream; when
//! the code under test first needs to wait for it, an event is recorded exactly there (the precise marks the
//! real device keeps too), unless that use has already run. Events complete when their record op runs, a wait
//! blocks its stream until the event has completed, and `synchronize` advances only the streams the event
//! depends on. Failures are injected into the [`Timeline`] calls on demand (`fail_after`) or at random
//! (`fail_one_in`, from a seeded xorshift).

use super::Timeline;
use std::cell::{Ref, RefCell};
use std::collections::VecDeque;

/// What a test attaches to each use; its hook runs when the use executes.
pub(crate) trait Payload: Sized {
    /// Called just before `uses[id]` executes (it is not marked executed yet), with every use enqueued so
    /// far, in enqueue order: a test asserts here what must have run before it. Does nothing by default.
    fn before_execute(_uses: &[Use<Self>], _id: usize) {}
}

/// One operation queued on a simulated stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Index into the uses (see [`Sim::uses`]).
    Use(usize),
    /// Completes the event.
    Record(usize),
    /// Blocks the stream until the event has completed.
    Wait(usize),
}

/// A use enqueued on the simulated device.
#[derive(Debug)]
pub(crate) struct Use<U> {
    /// What the test attached to it.
    pub(crate) payload: U,
    /// The stream it was enqueued on.
    pub(crate) stream: usize,
    /// Whether it has run.
    pub(crate) executed: bool,
}

/// The error of an injected failure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Injected;

/// How often the code under test called each `Timeline` method (failed calls included).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) records: usize,
    pub(crate) waits: usize,
    pub(crate) queries: usize,
    pub(crate) syncs: usize,
}

/// An event: the stream it was recorded on and whether it has completed.
#[derive(Debug)]
struct Event {
    stream: usize,
    complete: bool,
}

/// A mark: right after use `after` of its stream (`None`: before any use), with the event recorded for it once
/// someone had to wait, and whether it was seen complete.
#[derive(Debug)]
struct Mark {
    after: Option<usize>,
    event: Option<usize>,
    complete: bool,
}

/// The device's state, behind the `RefCell` of a [`Sim`].
#[derive(Debug)]
struct Device<U> {
    queues: Vec<VecDeque<Op>>,
    events: Vec<Event>,
    marks: Vec<Mark>,
    /// The last use enqueued on each stream.
    last: Vec<Option<usize>>,
    /// Every use ever enqueued, in enqueue order.
    uses: Vec<Use<U>>,
    counts: Counts,
    /// Fail the `Timeline` call after this many more succeed.
    fail_after: Option<usize>,
    /// Fail each `Timeline` call with probability 1/`fail_one_in` (0: never), drawn from `rng`.
    fail_one_in: u64,
    rng: u64,
}

/// The `Timeline` over a simulated device: streams and events are indices.
pub(crate) struct Sim<U>(RefCell<Device<U>>);

/// xorshift64: the simulator's own randomness, seeded by the test.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

impl<U: Payload> Sim<U> {
    /// A device of `streams` streams that fails only on demand.
    pub(crate) fn new(streams: usize) -> Self {
        Self::with_failures(streams, 0, 1)
    }

    /// A device of `streams` streams that also fails one `Timeline` call in `fail_one_in` (0: none), at
    /// random from `seed`.
    pub(crate) fn with_failures(streams: usize, fail_one_in: u64, seed: u64) -> Self {
        Sim(RefCell::new(Device {
            queues: vec![VecDeque::new(); streams],
            events: Vec::new(),
            marks: Vec::new(),
            last: vec![None; streams],
            uses: Vec::new(),
            counts: Counts::default(),
            fail_after: None,
            fail_one_in,
            // xorshift must not start at 0.
            rng: seed | 1,
        }))
    }

    pub(crate) fn counts(&self) -> Counts {
        self.0.borrow().counts
    }

    /// Fails the `Timeline` call after `calls` more succeed.
    pub(crate) fn fail_after(&self, calls: usize) {
        self.0.borrow_mut().fail_after = Some(calls);
    }

    /// Fails the next `Timeline` call.
    pub(crate) fn fail_next(&self) {
        self.fail_after(0);
    }

    /// Injects no more failures, neither on demand nor at random.
    pub(crate) fn stop_failing(&self) {
        let mut d = self.0.borrow_mut();
        d.fail_after = None;
        d.fail_one_in = 0;
    }

    /// Every use enqueued so far, in enqueue order; an `Op::Use(id)` is `uses()[id]`.
    pub(crate) fn uses(&self) -> Ref<'_, [Use<U>]> {
        Ref::map(self.0.borrow(), |d| d.uses.as_slice())
    }

    /// Whether use `id` has run.
    pub(crate) fn executed(&self, id: usize) -> bool {
        self.0.borrow().uses[id].executed
    }

    /// The ops queued on `stream`, next first.
    pub(crate) fn queue(&self, stream: usize) -> Vec<Op> {
        self.0.borrow().queues[stream].iter().copied().collect()
    }

    /// Enqueues a use on `stream`, as the code under test does with its work; returns its id.
    pub(crate) fn enqueue(&self, stream: usize, payload: U) -> usize {
        let mut d = self.0.borrow_mut();
        let id = d.uses.len();
        d.uses.push(Use {
            payload,
            stream,
            executed: false,
        });
        d.queues[stream].push_back(Op::Use(id));
        d.last[stream] = Some(id);
        id
    }

    /// The event recorded for `mark`, if one was.
    pub(crate) fn mark_event(&self, mark: usize) -> Option<usize> {
        self.0.borrow().marks[mark].event
    }

    /// The point right after the last use enqueued on `stream`, for `record_use`. Makes no `Timeline` call.
    pub(crate) fn mark(&self, stream: usize) -> usize {
        let mut d = self.0.borrow_mut();
        let after = d.last[stream];
        d.marks.push(Mark {
            after,
            event: None,
            complete: false,
        });
        d.marks.len() - 1
    }

    /// Runs the next op of `stream` unless it is blocked or idle; whether it ran one.
    pub(crate) fn advance(&self, stream: usize) -> bool {
        self.0.borrow_mut().advance(stream)
    }

    /// Runs `stream` until it is empty or blocked.
    pub(crate) fn finish(&self, stream: usize) {
        while self.advance(stream) {}
    }

    /// Runs every queue to the end, picking among the runnable streams at random.
    pub(crate) fn drain(&self, seed: u64) {
        let mut rng = seed | 1;
        let mut d = self.0.borrow_mut();
        loop {
            let runnable: Vec<usize> = (0..d.queues.len()).filter(|&s| d.runnable(s)).collect();
            if runnable.is_empty() {
                assert!(
                    d.queues.iter().all(VecDeque::is_empty),
                    "deadlock: every non-empty stream waits for an event that cannot complete: {:?}",
                    d.queues
                );
                return;
            }
            let pick = runnable[(next_random(&mut rng) % runnable.len() as u64) as usize];
            d.advance(pick);
        }
    }
}

impl<U: Payload> Device<U> {
    fn inject(&mut self) -> Result<(), Injected> {
        match self.fail_after {
            Some(0) => {
                self.fail_after = None;
                return Err(Injected);
            }
            Some(ref mut calls) => *calls -= 1,
            None => {}
        }
        if self.fail_one_in > 0 && next_random(&mut self.rng).is_multiple_of(self.fail_one_in) {
            return Err(Injected);
        }
        Ok(())
    }

    fn runnable(&self, stream: usize) -> bool {
        match self.queues[stream].front() {
            None => false,
            Some(Op::Wait(event)) => self.events[*event].complete,
            Some(_) => true,
        }
    }

    fn advance(&mut self, stream: usize) -> bool {
        if !self.runnable(stream) {
            return false;
        }
        match self.queues[stream].pop_front() {
            Some(Op::Use(id)) => {
                U::before_execute(&self.uses, id);
                self.uses[id].executed = true;
            }
            Some(Op::Record(event)) => self.events[event].complete = true,
            Some(Op::Wait(_)) | None => {}
        }
        true
    }

    /// Advances only the streams `event` depends on until it completes, as a blocking host wait would.
    fn run_until(&mut self, event: usize, depth: usize) {
        // Waits only point at events recorded earlier, so a chain longer than the streams is a cycle.
        assert!(
            depth <= self.queues.len(),
            "wait cycle reaching event {event}"
        );
        while !self.events[event].complete {
            let stream = self.events[event].stream;
            match self.queues[stream].front().copied() {
                Some(Op::Wait(blocker)) if !self.events[blocker].complete => {
                    self.run_until(blocker, depth + 1)
                }
                Some(_) => {
                    self.advance(stream);
                }
                None => {
                    unreachable!("event {event} is incomplete but its stream {stream} is empty")
                }
            }
        }
    }
}

impl<U: Payload> Device<U> {
    /// The event to wait for to see the work before `mark` complete, recorded now right after that work if it
    /// has none yet; `None` once that work is known complete. Finding out whether the marked use has run is a
    /// query (it counts, and can fail), as the real device's stream query is.
    fn event_of(&mut self, mark: usize) -> Result<Option<usize>, Injected> {
        let m = &self.marks[mark];
        if m.complete {
            return Ok(None);
        }
        if let Some(event) = m.event {
            return Ok(Some(event));
        }
        self.counts.queries += 1;
        self.inject()?;
        let Some(after) = self.marks[mark].after.filter(|&id| !self.uses[id].executed) else {
            self.marks[mark].complete = true;
            return Ok(None);
        };
        self.counts.records += 1;
        self.inject()?;
        let stream = self.uses[after].stream;
        let event = self.events.len();
        self.events.push(Event {
            stream,
            complete: false,
        });
        let at = self.queues[stream]
            .iter()
            .position(|op| *op == Op::Use(after))
            .expect("sim: a use that has not run is still queued");
        self.queues[stream].insert(at + 1, Op::Record(event));
        self.marks[mark].event = Some(event);
        Ok(Some(event))
    }
}

impl<U: Payload> Timeline for Sim<U> {
    type Stream = usize;
    type Mark = usize;
    type Error = Injected;

    fn wait(&self, stream: &usize, _on: &usize, mark: &usize) -> Result<(), Injected> {
        let mut d = self.0.borrow_mut();
        let Some(event) = d.event_of(*mark)? else {
            return Ok(());
        };
        d.counts.waits += 1;
        d.inject()?;
        d.queues[*stream].push_back(Op::Wait(event));
        Ok(())
    }

    fn is_complete(&self, _on: &usize, mark: &usize) -> Result<bool, Injected> {
        let mut d = self.0.borrow_mut();
        let Some(event) = d.event_of(*mark)? else {
            return Ok(true);
        };
        d.counts.queries += 1;
        d.inject()?;
        let complete = d.events[event].complete;
        d.marks[*mark].complete = complete;
        Ok(complete)
    }

    fn synchronize(&self, _on: &usize, mark: &usize) -> Result<(), Injected> {
        let mut d = self.0.borrow_mut();
        let Some(event) = d.event_of(*mark)? else {
            return Ok(());
        };
        d.counts.syncs += 1;
        d.inject()?;
        d.run_until(event, 0);
        d.marks[*mark].complete = true;
        Ok(())
    }
}
