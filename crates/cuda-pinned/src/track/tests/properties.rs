//! The tracker's property tests: random programs of device work, host accesses, releases and frees, with
//! failures injected, run against the simulated device on random schedules.

use proptest::prelude::*;

use super::{Kind, Sim, T, device_use};
use crate::track::Access;
use crate::track::sim::{Counts, Injected};

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
