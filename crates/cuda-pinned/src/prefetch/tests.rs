//! The prefetcher's slot state machine on the CPU: unit tests of each rule, and a property test of random
//! interleavings of workers (completing in any order) and a consumer (taking and giving back at random).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::slots::{Assign, Counts, Slots, Take};

/// Slots are numbered, errors are the failed position.
type Machine = Slots<u32, usize>;

fn machine(slots: u32, total: usize, ordered: bool) -> Machine {
    Slots::new((0..slots).collect(), total, ordered)
}

fn fill(m: &mut Machine) -> (u32, usize) {
    match m.assign() {
        Assign::Fill { slot, position } => (slot, position),
        other => panic!("expected a slot to fill, got {other:?}"),
    }
}

fn take(m: &mut Machine) -> (u32, usize) {
    match m.take() {
        Take::Batch { slot, position } => (slot, position),
        other => panic!("expected a batch, got {other:?}"),
    }
}

#[test]
fn ordered_delivery_reorders_completions() {
    let mut m = machine(3, 3, true);
    let (a, p0) = fill(&mut m);
    let (b, p1) = fill(&mut m);
    let (c, p2) = fill(&mut m);
    assert_eq!((p0, p1, p2), (0, 1, 2));
    assert_eq!(m.assign(), Assign::Done, "every position is out");
    assert_eq!(m.complete(2, Ok(c)), None);
    assert_eq!(m.complete(1, Ok(b)), None);
    assert_eq!(m.take(), Take::Wait, "position 0 is still being filled");
    assert_eq!(m.complete(0, Ok(a)), None);
    assert_eq!(take(&mut m), (a, 0));
    assert_eq!(take(&mut m), (b, 1));
    assert_eq!(take(&mut m), (c, 2));
    assert_eq!(m.take(), Take::End);
    assert_eq!(m.take(), Take::End, "the end stays the end");
    for slot in [a, b, c] {
        assert_eq!(m.give_back(slot), None);
    }
    m.check();
    assert_eq!(
        m.counts(),
        Counts {
            free: 3,
            delivered: 3,
            ..Counts::default()
        }
    );
}

#[test]
fn unordered_delivery_follows_completions() {
    let mut m = machine(2, 2, false);
    let (a, _) = fill(&mut m);
    let (b, _) = fill(&mut m);
    m.complete(1, Ok(b));
    assert_eq!(take(&mut m), (b, 1));
    m.complete(0, Ok(a));
    assert_eq!(take(&mut m), (a, 0));
    assert_eq!(m.take(), Take::End);
}

#[test]
fn slots_are_reused_and_depth_bounds_the_lead() {
    let mut m = machine(2, 5, true);
    let (a, _) = fill(&mut m);
    let (b, _) = fill(&mut m);
    assert_eq!(m.assign(), Assign::Wait, "two slots, two batches in flight");
    m.complete(0, Ok(a));
    m.complete(1, Ok(b));
    assert_eq!(m.assign(), Assign::Wait, "filled but not yet delivered");
    let (x, _) = take(&mut m);
    assert_eq!(m.assign(), Assign::Wait, "delivered but still held");
    m.give_back(x);
    assert_eq!(
        m.assign(),
        Assign::Fill {
            slot: x,
            position: 2
        }
    );
    m.check();
}

#[test]
fn a_consumer_holding_every_slot_is_told_not_left_waiting() {
    let mut m = machine(2, 10, true);
    for _ in 0..2 {
        let (slot, position) = fill(&mut m);
        m.complete(position, Ok(slot));
    }
    let (a, _) = take(&mut m);
    let (_b, _) = take(&mut m);
    assert_eq!(m.take(), Take::AllHeld);
    assert_eq!(m.take(), Take::AllHeld, "asking again does not change it");
    m.give_back(a);
    assert_eq!(m.take(), Take::Wait, "a slot is free for a worker now");
    let (slot, position) = fill(&mut m);
    assert_eq!(position, 2);
    m.complete(position, Ok(slot));
    assert_eq!(take(&mut m), (a, 2));
    m.check();
}

#[test]
fn an_error_is_delivered_in_place_and_ends_the_stream() {
    let mut m = machine(4, 10, true);
    let filled: Vec<_> = (0..4).map(|_| fill(&mut m)).collect();
    // Position 3 completes first, then 2 fails, then 1 and 0 complete.
    m.complete(3, Ok(filled[3].0));
    m.complete(2, Err((filled[2].0, 2)));
    assert_eq!(
        m.counts().free,
        2,
        "the failed slot and the one past the error are free"
    );
    assert_eq!(
        m.assign(),
        Assign::Done,
        "no position goes out after an error"
    );
    m.complete(1, Ok(filled[1].0));
    m.complete(0, Ok(filled[0].0));
    assert_eq!(take(&mut m).1, 0);
    assert_eq!(take(&mut m).1, 1);
    assert_eq!(
        m.take(),
        Take::Failed {
            position: 2,
            error: 2
        }
    );
    assert_eq!(m.take(), Take::End);
    m.check();
}

#[test]
fn an_earlier_error_replaces_a_later_one() {
    let mut m = machine(3, 10, true);
    let filled: Vec<_> = (0..3).map(|_| fill(&mut m)).collect();
    m.complete(2, Err((filled[2].0, 2)));
    m.complete(1, Err((filled[1].0, 1)));
    m.complete(0, Ok(filled[0].0));
    assert_eq!(take(&mut m).1, 0);
    assert_eq!(
        m.take(),
        Take::Failed {
            position: 1,
            error: 1
        }
    );
    assert_eq!(m.take(), Take::End);
    m.check();
}

#[test]
fn unordered_an_error_ends_the_stream_after_what_completed_before_it() {
    let mut m = machine(3, 10, false);
    let filled: Vec<_> = (0..3).map(|_| fill(&mut m)).collect();
    m.complete(2, Ok(filled[2].0));
    m.complete(0, Err((filled[0].0, 0)));
    m.complete(1, Ok(filled[1].0)); // after the error: dropped
    assert_eq!(take(&mut m).1, 2);
    assert_eq!(
        m.take(),
        Take::Failed {
            position: 0,
            error: 0
        }
    );
    assert_eq!(m.take(), Take::End);
    assert_eq!(m.counts().free, 2);
    m.check();
}

#[test]
fn stop_hands_back_every_slot_for_dropping() {
    let mut m = machine(4, 100, true);
    let (a, pa) = fill(&mut m);
    let (b, pb) = fill(&mut m);
    let (c, pc) = fill(&mut m);
    m.complete(pa, Ok(a));
    m.complete(pc, Ok(c)); // ready, waiting for b
    let (held, _) = take(&mut m);
    let unused = 6 - a - b - c; // the fourth slot, never handed out
    let mut dropped = m.stop();
    dropped.sort_unstable();
    let mut want = vec![c, unused];
    want.sort_unstable();
    assert_eq!(dropped, want, "the free slot and the ready one");
    assert_eq!(m.assign(), Assign::Done);
    assert_eq!(
        m.complete(pb, Ok(b)),
        Some(b),
        "a worker's slot after the stop"
    );
    assert_eq!(
        m.give_back(held),
        Some(held),
        "the consumer's after the stop"
    );
}

#[test]
fn empty_streams_and_fewer_batches_than_slots() {
    let mut m = Slots::<u32, usize>::new(Vec::new(), 0, true);
    assert_eq!(m.assign(), Assign::Done);
    assert_eq!(m.take(), Take::End);
    let mut m = machine(4, 1, true);
    let (slot, position) = fill(&mut m);
    assert_eq!(m.assign(), Assign::Done);
    m.complete(position, Ok(slot));
    assert_eq!(take(&mut m), (slot, 0));
    assert_eq!(m.take(), Take::End);
}

#[test]
#[should_panic(expected = "which no worker was filling")]
fn a_completion_nobody_started_is_a_bug() {
    let mut m = machine(1, 1, true);
    m.complete(0, Ok(0));
}

/// One step of a random run.
#[derive(Clone, Debug)]
enum Step {
    /// A worker asks for work.
    Assign,
    /// The worker holding the n-th (modulo) slot in flight completes it.
    Complete(usize),
    /// The consumer asks for the next batch.
    Take,
    /// The consumer gives back the n-th (modulo) batch it holds.
    GiveBack(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Assign),
        3 => any::<usize>().prop_map(Step::Complete),
        3 => Just(Step::Take),
        2 => any::<usize>().prop_map(Step::GiveBack),
    ]
}

/// A run of the machine next to a model of the workers and the consumer.
struct Run {
    m: Machine,
    ordered: bool,
    depth: u32,
    total: usize,
    fail: BTreeSet<usize>,
    /// Slots workers hold: (slot, position).
    filling: Vec<(u32, usize)>,
    /// Slots the consumer holds: (slot, position).
    held: Vec<(u32, usize)>,
    /// Which slot filled each position.
    filled_in: BTreeMap<usize, u32>,
    /// What was delivered, in order: the position and whether it was the error.
    delivered: Vec<(usize, bool)>,
    ended: bool,
}

impl Run {
    fn outside(&self) -> impl Iterator<Item = u32> + '_ {
        self.filling.iter().chain(&self.held).map(|&(slot, _)| slot)
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Assign => match self.m.assign() {
                Assign::Fill { slot, position } => {
                    assert!(slot < self.depth);
                    assert!(
                        self.outside().all(|s| s != slot),
                        "slot {slot} handed out while in use"
                    );
                    assert!(position < self.total);
                    assert!(
                        self.filled_in.insert(position, slot).is_none(),
                        "position {position} handed out twice"
                    );
                    self.filling.push((slot, position));
                }
                Assign::Wait => assert_eq!(
                    self.filling.len() + self.m.counts().ready + self.held.len(),
                    self.depth as usize,
                    "a worker waits while a slot is free"
                ),
                Assign::Done => {}
            },
            Step::Complete(n) => {
                if self.filling.is_empty() {
                    return;
                }
                let (slot, position) = self.filling.swap_remove(n % self.filling.len());
                let outcome = if self.fail.contains(&position) {
                    Err((slot, position))
                } else {
                    Ok(slot)
                };
                assert_eq!(self.m.complete(position, outcome), None);
            }
            Step::Take => match self.m.take() {
                Take::Batch { slot, position } => {
                    assert!(!self.ended, "a batch after the end");
                    assert_eq!(
                        self.filled_in.get(&position),
                        Some(&slot),
                        "position {position} delivered in a slot that did not fill it"
                    );
                    assert!(self.outside().all(|s| s != slot));
                    assert!(!self.fail.contains(&position));
                    self.delivered.push((position, false));
                    self.held.push((slot, position));
                }
                Take::Failed { position, error } => {
                    assert!(!self.ended);
                    assert_eq!(position, error);
                    assert!(self.fail.contains(&position));
                    self.delivered.push((position, true));
                    self.ended = true;
                }
                Take::Wait => {
                    assert!(!self.ended);
                    assert!(self.held.len() < self.depth as usize);
                }
                Take::AllHeld => {
                    assert!(!self.ended);
                    assert_eq!(self.held.len(), self.depth as usize);
                }
                Take::End => self.ended = true,
            },
            Step::GiveBack(n) => {
                if self.held.is_empty() {
                    return;
                }
                let (slot, _) = self.held.swap_remove(n % self.held.len());
                assert_eq!(self.m.give_back(slot), None);
            }
        }
        self.m.check();
        let c = self.m.counts();
        assert_eq!(c.filling, self.filling.len());
        assert_eq!(c.held, self.held.len());
        assert!(c.filling + c.ready + c.held <= self.depth as usize);
    }

    /// Runs everything still pending to the end: workers complete, the consumer takes and gives back.
    fn finish(&mut self) {
        for _ in 0..10 * (self.total + self.depth as usize + 10) {
            if self.ended {
                break;
            }
            while !self.filling.is_empty() {
                self.apply(&Step::Complete(0));
            }
            self.apply(&Step::Assign);
            self.apply(&Step::Take);
            while !self.held.is_empty() {
                self.apply(&Step::GiveBack(0));
            }
        }
        assert!(self.ended, "the stream never ended");
    }

    /// What was delivered must be what the stream promises.
    fn check_delivery(&self) {
        let first_failure = self.fail.range(..self.total).next().copied();
        if self.ordered {
            let want: Vec<(usize, bool)> = match first_failure {
                Some(f) => (0..f).map(|p| (p, false)).chain([(f, true)]).collect(),
                None => (0..self.total).map(|p| (p, false)).collect(),
            };
            assert_eq!(self.delivered, want);
        } else {
            let positions: BTreeSet<usize> = self.delivered.iter().map(|&(p, _)| p).collect();
            assert_eq!(
                positions.len(),
                self.delivered.len(),
                "a position delivered twice"
            );
            match first_failure {
                None => assert_eq!(positions, (0..self.total).collect()),
                Some(_) => {
                    let (last, failed) = *self.delivered.last().expect("the error is delivered");
                    assert!(failed && self.fail.contains(&last));
                    assert!(
                        self.delivered[..self.delivered.len() - 1]
                            .iter()
                            .all(|&(_, f)| !f)
                    );
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn random_interleavings_keep_every_promise(
        depth in 1u32..6,
        total in 0usize..40,
        ordered in any::<bool>(),
        fail in proptest::collection::btree_set(0usize..60, 0..3),
        steps in proptest::collection::vec(step(), 0..300),
    ) {
        let mut run = Run {
            m: machine(depth, total, ordered),
            ordered,
            depth,
            total,
            fail,
            filling: Vec::new(),
            held: Vec::new(),
            filled_in: BTreeMap::new(),
            delivered: Vec::new(),
            ended: false,
        };
        for step in &steps {
            run.apply(step);
        }
        run.finish();
        run.check_delivery();
    }
}
