//! The tracker's unit tests and its property test against a simulated device.

use super::sim::{self, Counts, Injected, Op, Payload};
use super::*;
use proptest::prelude::*;

// ---- The simulated device --------------------------------------------------------------------------

/// How a use touches a buffer on the simulated device; `Free` is the stream-ordered release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Free,
}

impl From<Access> for Kind {
    fn from(access: Access) -> Self {
        match access {
            Access::Read => Kind::Read,
            Access::Write => Kind::Write,
        }
    }
}

/// Only two reads may run in either order.
fn conflicts(a: Kind, b: Kind) -> bool {
    !(a == Kind::Read && b == Kind::Read)
}

/// What a use enqueued on the simulated device does: the buffer it touches and how.
#[derive(Debug)]
struct Touch {
    buffer: u32,
    kind: Kind,
}

impl Payload for Touch {
    /// The happens-before check: a use may run only after every conflicting use of its buffer enqueued
    /// before it, whichever streams they were on and whatever order the test advanced them in.
    fn before_execute(uses: &[sim::Use<Self>], id: usize) {
        let this = &uses[id];
        for (earlier_id, earlier) in uses[..id].iter().enumerate() {
            assert!(
                earlier.payload.buffer != this.payload.buffer
                    || !conflicts(earlier.payload.kind, this.payload.kind)
                    || earlier.executed,
                "race on buffer {}: use {id} ({:?} on stream {}) ran before use {earlier_id} ({:?} on stream {})",
                this.payload.buffer,
                this.payload.kind,
                this.stream,
                earlier.payload.kind,
                earlier.stream
            );
        }
    }
}

/// The shared simulated device, its uses touching the tracked buffers.
type Sim = sim::Sim<Touch>;

impl Sim {
    /// Enqueues a use of `buffer` on `stream`, as the buffers do between `prepare` and `record_use`.
    fn touch(&self, buffer: u32, stream: usize, kind: Kind) -> usize {
        self.enqueue(stream, Touch { buffer, kind })
    }

    /// Asserts that every use of `buffer` conflicting with `kind` has executed: what a host access of that
    /// kind (or, for `Free`, a release) must see.
    fn assert_host_ordered(&self, buffer: u32, kind: Kind, what: &str) {
        for (id, u) in self.uses().iter().enumerate() {
            assert!(
                u.payload.buffer != buffer || !conflicts(u.payload.kind, kind) || u.executed,
                "{what} on buffer {buffer} returned while use {id} ({:?} on stream {}) had not run",
                u.payload.kind,
                u.stream
            );
        }
    }
}

type T = Tracker<usize, usize>;

/// `prepare`, enqueue on the device, `record_use`: one use as a buffer performs it.
fn device_use(tracker: &mut T, sim: &Sim, buffer: u32, stream: usize, access: Access) -> usize {
    tracker.prepare(sim, &stream, access).unwrap();
    let id = sim.touch(buffer, stream, access.into());
    tracker.record_use(&stream, &sim.mark(stream), access);
    id
}

/// The tracker's structural invariant: at most one read entry per stream.
fn assert_shape(tracker: &T) {
    for (i, a) in tracker.reads.iter().enumerate() {
        for b in &tracker.reads[i + 1..] {
            assert!(
                a.stream != b.stream,
                "two read entries for stream {}",
                a.stream
            );
        }
    }
}

// ---- Unit tests ------------------------------------------------------------------------------------

#[test]
fn same_stream_work_records_no_event_and_no_wait() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Write);
    assert_eq!(sim.counts(), Counts::default());
    assert_eq!(
        sim.queue(1),
        [Op::Use(0), Op::Use(1), Op::Use(2), Op::Use(3)]
    );
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| w.stream == 1 && sim.mark_event(w.mark).is_none())
    );
    assert!(t.reads.is_empty());
}

#[test]
fn read_after_write_on_another_stream_waits_for_the_write() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    assert_eq!(
        sim.counts(),
        Counts {
            records: 1,
            waits: 1,
            queries: 1,
            ..Counts::default()
        }
    );
    assert_eq!(sim.queue(0), [Op::Use(0), Op::Record(0)]);
    assert_eq!(sim.queue(1), [Op::Wait(0), Op::Use(1)]);
    // The read is not ordered before anything yet, so it has no event.
    assert!(t.reads.len() == 1 && sim.mark_event(t.reads[0].mark).is_none());
}

#[test]
fn write_after_read_on_another_stream_waits_for_the_read() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Write);
    assert_eq!(
        sim.counts(),
        Counts {
            records: 1,
            waits: 1,
            queries: 1,
            ..Counts::default()
        }
    );
    assert_eq!(sim.queue(0), [Op::Use(0), Op::Record(0)]);
    assert_eq!(sim.queue(1), [Op::Wait(0), Op::Use(1)]);
    assert!(t.reads.is_empty());
    assert_eq!(t.sole_stream(), Some(&1));
}

#[test]
fn write_after_write_on_another_stream_waits_for_the_write() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Write);
    assert_eq!(
        sim.counts(),
        Counts {
            records: 1,
            waits: 1,
            queries: 1,
            ..Counts::default()
        }
    );
    assert_eq!(sim.queue(1), [Op::Wait(0), Op::Use(1)]);
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| w.stream == 1 && sim.mark_event(w.mark).is_none())
    );
}

#[test]
fn the_event_follows_the_marked_work_not_later_work_on_its_stream() {
    let sim = Sim::new(2);
    let (mut a, mut b) = (T::new(), T::new());
    device_use(&mut a, &sim, 0, 0, Access::Write);
    // Unrelated work queued on stream 0 after the write: a wait for the write must not wait for it.
    device_use(&mut b, &sim, 1, 0, Access::Write);
    device_use(&mut a, &sim, 0, 1, Access::Read);
    assert_eq!(sim.queue(0), [Op::Use(0), Op::Record(0), Op::Use(1)]);
    assert_eq!(sim.queue(1), [Op::Wait(0), Op::Use(2)]);
}

#[test]
fn work_seen_complete_is_not_waited_for_again() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    sim.finish(0);
    // Long unrelated work on stream 0 afterwards: the write on stream 1 must not wait for it.
    sim.touch(1, 0, Kind::Write);
    device_use(&mut t, &sim, 0, 1, Access::Write);
    assert_eq!(sim.counts().records, 0);
    assert_eq!(sim.counts().waits, 0);
    assert_eq!(sim.queue(1), [Op::Use(2)]);
}

#[test]
fn reads_do_not_wait_for_reads() {
    let sim = Sim::new(3);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Read);
    assert_eq!(sim.counts(), Counts::default());
    assert_eq!(t.reads.len(), 3);
}

#[test]
fn one_event_serves_every_waiter() {
    let sim = Sim::new(3);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Read);
    assert_eq!(
        sim.counts(),
        Counts {
            records: 1,
            waits: 2,
            queries: 1,
            ..Counts::default()
        }
    );
    assert_eq!(sim.queue(2), [Op::Wait(0), Op::Use(2)]);
}

#[test]
fn a_write_waits_for_every_read_of_other_streams_and_clears_them() {
    let sim = Sim::new(3);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Write);
    // Stream 2's own read is covered by stream order.
    assert_eq!(
        sim.counts(),
        Counts {
            records: 2,
            waits: 2,
            queries: 2,
            ..Counts::default()
        }
    );
    assert_eq!(
        sim.queue(2),
        [Op::Use(2), Op::Wait(0), Op::Wait(1), Op::Use(3)]
    );
    assert!(t.reads.is_empty());
    // Whoever waits for the write now is ordered after those reads through it: one wait.
    device_use(&mut t, &sim, 0, 0, Access::Write);
    assert_eq!(sim.counts().waits, 3);
}

#[test]
fn repeated_reads_on_one_stream_keep_one_entry_at_the_newest_mark() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    // Another stream's write forces the read's event...
    t.prepare(&sim, &1, Access::Write).unwrap();
    assert!(sim.mark_event(t.reads[0].mark).is_some());
    // ...but that write fails to enqueue; a newer read replaces the entry, and the old event, which
    // predates it, must not stand for it.
    let capacity = t.reads.capacity();
    for _ in 0..10 {
        device_use(&mut t, &sim, 0, 0, Access::Read);
    }
    assert_eq!(t.reads.len(), 1);
    assert!(sim.mark_event(t.reads[0].mark).is_none());
    assert_eq!(t.reads.capacity(), capacity);
}

#[test]
fn a_failed_enqueue_after_prepare_leaves_the_tracker_correct() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 0, Access::Read);
    t.prepare(&sim, &1, Access::Write).unwrap();
    // No record_use: both entries stay, now with events, so the next attempt reuses them.
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| sim.mark_event(w.mark).is_some())
    );
    assert_eq!(t.reads.len(), 1);
    let records = sim.counts().records;
    t.prepare(&sim, &1, Access::Write).unwrap();
    assert_eq!(sim.counts().records, records);
}

#[test]
fn host_read_waits_for_the_write_only() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    t.host_wait(&sim, Access::Read).unwrap();
    assert_eq!(sim.counts(), Counts::default());
    assert_eq!(t.reads.len(), 1);

    device_use(&mut t, &sim, 0, 0, Access::Write);
    let read = device_use(&mut t, &sim, 0, 1, Access::Read);
    t.host_wait(&sim, Access::Read).unwrap();
    sim.assert_host_ordered(0, Kind::Read, "host read");
    // The host waited for the write only, not for the read on stream 1.
    assert_eq!(sim.counts().syncs, 1);
    assert!(!sim.executed(read));
    assert!(t.write.is_none());
    assert_eq!(t.reads.len(), 1);
}

#[test]
fn host_write_waits_for_everything_and_leaves_nothing_in_flight() {
    let sim = Sim::new(3);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Read);
    t.host_wait(&sim, Access::Write).unwrap();
    sim.assert_host_ordered(0, Kind::Write, "host write");
    assert!(t.is_empty());
    assert_eq!(t.sole_stream(), None);
}

#[test]
fn try_host_is_false_until_the_work_completes() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    assert!(!t.try_host(&sim, Access::Write).unwrap());
    // The poll recorded the events of both entries, so the next polls only query.
    let records = sim.counts().records;
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| sim.mark_event(w.mark).is_some())
    );
    assert!(sim.mark_event(t.reads[0].mark).is_some());
    assert!(sim.advance(0) && sim.advance(0)); // the write, its event
    assert!(!t.try_host(&sim, Access::Write).unwrap());
    assert!(t.write.is_none(), "a write seen complete is forgotten");
    assert!(t.try_host(&sim, Access::Read).unwrap());
    while sim.advance(1) {}
    assert!(t.try_host(&sim, Access::Write).unwrap());
    assert!(t.is_empty());
    assert_eq!(sim.counts().records, records);
    assert_eq!(sim.counts().syncs, 0);
}

#[test]
fn is_idle_only_when_every_entry_has_completed() {
    let sim = Sim::new(2);
    let mut t = T::new();
    assert!(t.is_idle(&sim).unwrap());
    device_use(&mut t, &sim, 0, 0, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    assert!(!t.is_idle(&sim).unwrap());
    while sim.advance(0) {}
    assert!(!t.is_idle(&sim).unwrap());
    assert_eq!(t.sole_stream(), Some(&1));
    while sim.advance(1) {}
    assert!(t.is_idle(&sim).unwrap());
    sim.assert_host_ordered(0, Kind::Free, "is_idle");
    assert!(t.is_empty());
}

#[test]
fn order_before_makes_a_free_wait_for_other_streams_and_keeps_the_entries() {
    let sim = Sim::new(3);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Read);
    t.order_before(&sim, &1).unwrap();
    // The write's event (0), which the read on stream 1 waited for too, and the read on stream 2's (1);
    // not stream 1's own read.
    assert_eq!(
        sim.queue(1),
        [Op::Wait(0), Op::Use(1), Op::Wait(0), Op::Wait(1)]
    );
    assert!(t.write.is_some());
    assert_eq!(t.reads.len(), 2);
    let free = sim.touch(0, 1, Kind::Free);
    sim.drain(7);
    assert!(sim.executed(free));
}

#[test]
fn synchronize_all_leaves_nothing_in_flight() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Read);
    device_use(&mut t, &sim, 0, 1, Access::Write);
    t.synchronize_all(&sim).unwrap();
    sim.assert_host_ordered(0, Kind::Free, "synchronize_all");
    assert!(t.is_empty());
}

#[test]
fn a_failed_record_propagates_and_forgets_nothing() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    sim.fail_next();
    assert_eq!(t.prepare(&sim, &1, Access::Read), Err(Injected));
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| w.stream == 0 && sim.mark_event(w.mark).is_none())
    );
    sim.fail_next();
    assert_eq!(t.host_wait(&sim, Access::Read), Err(Injected));
    sim.fail_next();
    assert_eq!(t.try_host(&sim, Access::Read), Err(Injected));
    sim.fail_next();
    assert_eq!(t.is_idle(&sim), Err(Injected));
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| w.stream == 0 && sim.mark_event(w.mark).is_none())
    );
    assert_eq!(sim.queue(1), []);
}

#[test]
fn a_failed_wait_propagates_and_keeps_the_event() {
    let sim = Sim::new(2);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    // Fail the wait, not the record: record first (a poll does) so the failure hits `wait`.
    assert!(!t.try_host(&sim, Access::Read).unwrap());
    sim.fail_next();
    assert_eq!(t.order_before(&sim, &1), Err(Injected));
    assert!(
        t.write
            .as_ref()
            .is_some_and(|w| sim.mark_event(w.mark) == Some(0))
    );
    t.order_before(&sim, &1).unwrap();
    assert_eq!(sim.queue(1), [Op::Wait(0)]);
}

#[test]
fn a_failed_synchronize_or_query_forgets_only_what_was_seen_complete() {
    let sim = Sim::new(3);
    let mut t = T::new();
    device_use(&mut t, &sim, 0, 0, Access::Write);
    device_use(&mut t, &sim, 0, 1, Access::Read);
    device_use(&mut t, &sim, 0, 2, Access::Read);
    // Record every event first, so that the failures below hit `synchronize` and `is_complete`.
    assert!(!t.try_host(&sim, Access::Write).unwrap());
    let syncs = sim.counts().syncs;
    // The write's synchronize succeeds, the first read's fails.
    sim.fail_after(1);
    assert_eq!(t.host_wait(&sim, Access::Write), Err(Injected));
    assert_eq!(sim.counts().syncs, syncs + 2);
    assert!(t.write.is_none(), "the write was seen complete");
    assert_eq!(t.reads.len(), 2, "neither read was seen complete");

    // The read on stream 1 completes; the query of the other one fails.
    while sim.advance(1) {}
    sim.fail_after(1);
    assert_eq!(t.is_idle(&sim), Err(Injected));
    assert_eq!(t.reads.len(), 1);
    assert_eq!(t.sole_stream(), Some(&2));

    t.synchronize_all(&sim).unwrap();
    sim.assert_host_ordered(0, Kind::Free, "synchronize_all");
    assert!(t.is_empty());
}

// ---- Random programs against the simulated device ---------------------------------------------------

/// One step of a random program. Indices are taken modulo the program's stream and buffer counts.
#[derive(Debug, Clone)]
enum Step {
    /// Device work: prepare, enqueue, record_use; or prepare and a failed enqueue.
    Use {
        buffer: usize,
        stream: usize,
        access: Access,
        enqueue_fails: bool,
    },
    /// A host access: `try_host` polled, advancing stream `polls[i]` after each false; if it never came
    /// true, `host_wait` if `block`, else the host gives up (leaving events recorded, entries pending).
    Host {
        buffer: usize,
        access: Access,
        polls: Vec<usize>,
        block: bool,
    },
    /// Deferred release: `is_idle` polled the same way; if it never came true, `synchronize_all` if
    /// `block`, else the buffer stays live to be checked again later (as a pool does). A buffer released,
    /// or leaked because a wait failed, is replaced by a fresh one.
    Release {
        buffer: usize,
        polls: Vec<usize>,
        block: bool,
    },
    /// Stream-ordered free: `order_before` then a free on `stream`, or on `sole_stream` if None.
    Free {
        buffer: usize,
        stream: Option<usize>,
    },
    /// Lets the device run `ops` ops of `stream`.
    Advance { stream: usize, ops: usize },
}

#[derive(Debug, Clone)]
struct Program {
    streams: usize,
    buffers: usize,
    steps: Vec<Step>,
    /// Inject a failure into one `Timeline` call in this many (0: none).
    fail_one_in: u64,
    seed: u64,
}

fn access() -> impl Strategy<Value = Access> {
    prop_oneof![Just(Access::Read), Just(Access::Write)]
}

fn step() -> impl Strategy<Value = Step> {
    let polls = || prop::collection::vec(0..4usize, 0..8);
    prop_oneof![
        6 => (0..4usize, 0..4usize, access(), prop::bool::weighted(0.1)).prop_map(
            |(buffer, stream, access, enqueue_fails)| Step::Use { buffer, stream, access, enqueue_fails }
        ),
        4 => (0..4usize, 1..4usize).prop_map(|(stream, ops)| Step::Advance { stream, ops }),
        2 => (0..4usize, access(), polls(), any::<bool>())
            .prop_map(|(buffer, access, polls, block)| Step::Host { buffer, access, polls, block }),
        1 => (0..4usize, polls(), any::<bool>())
            .prop_map(|(buffer, polls, block)| Step::Release { buffer, polls, block }),
        1 => (0..4usize, prop::option::of(0..4usize))
            .prop_map(|(buffer, stream)| Step::Free { buffer, stream }),
    ]
}

fn program() -> impl Strategy<Value = Program> {
    (
        2..=4usize,
        1..=4usize,
        prop::collection::vec(step(), 20..=60),
        prop_oneof![3 => Just(0u64), 1 => 6..20u64],
        any::<u64>(),
    )
        .prop_map(|(streams, buffers, steps, fail_one_in, seed)| Program {
            streams,
            buffers,
            steps,
            fail_one_in,
            seed,
        })
}

/// A buffer of the program: its identity on the device (fresh after each release) and its tracker.
struct Buffer {
    id: u32,
    tracker: T,
}

/// Runs `program`, asserting the ordering guarantees as the device and the host observe them.
fn run(program: &Program) {
    let sim = Sim::with_failures(program.streams, program.fail_one_in, program.seed);
    let mut next_id = 0;
    let mut fresh = || {
        next_id += 1;
        Buffer {
            id: next_id,
            tracker: T::new(),
        }
    };
    let mut buffers: Vec<Buffer> = (0..program.buffers).map(|_| fresh()).collect();
    let streams = program.streams;
    for step in &program.steps {
        match step {
            &Step::Use {
                buffer,
                stream,
                access,
                enqueue_fails,
            } => {
                let b = &mut buffers[buffer % program.buffers];
                let stream = stream % streams;
                if b.tracker.prepare(&sim, &stream, access).is_ok() && !enqueue_fails {
                    sim.touch(b.id, stream, access.into());
                    b.tracker.record_use(&stream, &sim.mark(stream), access);
                }
                assert_shape(&b.tracker);
            }
            Step::Host {
                buffer,
                access,
                polls,
                block,
            } => {
                let b = &mut buffers[buffer % program.buffers];
                let mut ready = false;
                for &k in polls {
                    match b.tracker.try_host(&sim, *access) {
                        Ok(true) => {
                            ready = true;
                            break;
                        }
                        Ok(false) => {
                            sim.advance(k % streams);
                        }
                        Err(Injected) => break,
                    }
                }
                if ready || (*block && b.tracker.host_wait(&sim, *access).is_ok()) {
                    sim.assert_host_ordered(b.id, (*access).into(), "host access");
                }
            }
            Step::Release {
                buffer,
                polls,
                block,
            } => {
                let slot = buffer % program.buffers;
                let b = &mut buffers[slot];
                let mut idle = false;
                for &k in polls {
                    if let Ok(true) = b.tracker.is_idle(&sim) {
                        idle = true;
                        break;
                    }
                    sim.advance(k % streams);
                }
                if !idle && !block {
                    continue;
                }
                if idle || b.tracker.synchronize_all(&sim).is_ok() {
                    assert!(b.tracker.is_empty());
                    sim.assert_host_ordered(b.id, Kind::Free, "release");
                }
                // Released, or leaked because a wait failed: either way the program moves on.
                buffers[slot] = fresh();
            }
            &Step::Free { buffer, stream } => {
                let slot = buffer % program.buffers;
                let b = &mut buffers[slot];
                let stream = match stream {
                    Some(stream) => stream % streams,
                    None => b.tracker.sole_stream().copied().unwrap_or(0),
                };
                if b.tracker.order_before(&sim, &stream).is_ok() {
                    // Checked when it executes: every use of the buffer must have run by then.
                    sim.touch(b.id, stream, Kind::Free);
                }
                buffers[slot] = fresh();
            }
            &Step::Advance { stream, ops } => {
                for _ in 0..ops {
                    sim.advance(stream % streams);
                }
            }
        }
    }
    sim.drain(program.seed.rotate_left(17));
}

// proptest's default of 256 cases runs in well under a second; set PROPTEST_CASES for a longer search.
proptest! {

    /// Whatever the program and the device's schedule, no use runs before a conflicting earlier one, the
    /// host never sees a buffer with conflicting work pending, and nothing is released early.
    #[test]
    fn random_programs_keep_happens_before(program in program()) {
        run(&program);
    }

    /// Work that stays on one stream records no event, makes no wait, and never grows the reads.
    #[test]
    fn single_stream_programs_record_no_events(
        stream in 0..4usize,
        uses in prop::collection::vec((0..4usize, access(), any::<bool>()), 20..=60),
    ) {
        let sim = Sim::new(4);
        let mut trackers: Vec<T> = (0..4).map(|_| T::new()).collect();
        let mut capacities = [0; 4];
        for (buffer, access, advance) in uses {
            let t = &mut trackers[buffer];
            device_use(t, &sim, buffer as u32, stream, access);
            prop_assert!(t.reads.len() <= 1);
            if capacities[buffer] != 0 {
                prop_assert_eq!(t.reads.capacity(), capacities[buffer]);
            }
            capacities[buffer] = t.reads.capacity();
            if advance {
                sim.advance(stream);
            }
        }
        prop_assert_eq!(sim.counts(), Counts::default());
        sim.drain(1);
    }
}
