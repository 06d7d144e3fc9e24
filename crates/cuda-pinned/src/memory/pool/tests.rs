//! The pool state's unit tests and its property test against a simulated device. The simulated device and
//! the model of the property test are in `fuzzing.rs`, which the fuzz target `pool_state` runs too.

use super::state::*;
use crate::fuzzing::pool::{PAGE, Program, STREAMS, Sim, Step, Track, run, wait_for_any, work};
use crate::track::sim::{Counts, Injected};
use crate::track::{Access, Timeline};
use proptest::prelude::*;

type Pool = PoolState<u32, usize, usize>;

fn pool(budget_pages: usize) -> Pool {
    Pool::new(Config {
        budget: budget_pages * PAGE,
        page: PAGE,
    })
}

/// A tracker with `block` written on `stream`.
fn written(sim: &Sim, block: u32, stream: usize) -> Track {
    let mut track = Track::new();
    work(sim, &mut track, block, stream, Access::Write);
    track
}

/// Takes `bytes` and expects a pin with nothing evicted, which it completes as block `id`.
fn pin_new(pool: &mut Pool, sim: &Sim, bytes: usize, id: u32) -> (u32, Lease) {
    match pool.take(sim, bytes) {
        Ok(Take::Pin { reservation, evict }) => {
            assert!(evict.is_empty(), "evicted {evict:?}");
            (id, pool.pinned(reservation))
        }
        other => panic!("expected a pin, got {other:?}"),
    }
}

/// Takes `bytes` and expects a hit, returning the block.
fn hit(pool: &mut Pool, sim: &Sim, bytes: usize) -> (u32, Lease) {
    match pool.take(sim, bytes) {
        Ok(Take::Hit { block, lease }) => (block, lease),
        other => panic!("expected a hit, got {other:?}"),
    }
}

/// Takes `bytes` and expects a pin, which it abandons; returns the evicted blocks.
fn miss(pool: &mut Pool, sim: &Sim, bytes: usize) -> Vec<u32> {
    match pool.take(sim, bytes) {
        Ok(Take::Pin { reservation, evict }) => {
            pool.pin_failed(reservation);
            evict
        }
        other => panic!("expected a pin, got {other:?}"),
    }
}

// ---- Size classes ----------------------------------------------------------------------------------

#[test]
fn classes_follow_the_formula() {
    let p = pool(1);
    let class = |bytes| p.class_of(bytes);
    assert_eq!(class(0), Some(PAGE));
    assert_eq!(class(1), Some(PAGE));
    assert_eq!(class(PAGE), Some(PAGE));
    assert_eq!(class(PAGE + 1), Some(2 * PAGE));
    assert_eq!(class(16 * PAGE - 1), Some(16 * PAGE));
    // Above 16 pages the granule is a sixteenth of the power of two above: 128 KiB / 16 = 8 KiB.
    assert_eq!(class(16 * PAGE + 1), Some(18 * PAGE));
    assert_eq!(class(3 << 20), Some(3 << 20));
    assert_eq!(class((3 << 20) + 1), Some((3 << 20) + (256 << 10)));
    assert_eq!(class(1 << 30), Some(1 << 30));
    // The worst case: just above a power of two, the waste is one granule less a byte.
    assert_eq!(class((1 << 30) + 1), Some((1 << 30) + (128 << 20)));
    assert_eq!(class(1 << (usize::BITS - 1)), Some(1 << (usize::BITS - 1)));
    assert_eq!(class((1 << (usize::BITS - 1)) + 1), None);
    assert_eq!(class(usize::MAX), None);
}

#[test]
#[should_panic(expected = "not a power of two")]
fn a_page_size_that_is_not_a_power_of_two_is_refused() {
    Pool::new(Config {
        budget: 1 << 20,
        page: 3000,
    });
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![1..=64 * PAGE, 1..=1usize << 40]
}

proptest! {
    /// Every class holds its request, is a whole number of pages, wastes less than a page up to 16 pages and
    /// less than 12.5% of the request above 8 pages, and classes are monotonic and idempotent.
    #[test]
    fn classes_waste_little(a in size(), b in size()) {
        let p = pool(1);
        for x in [a, b] {
            let c = p.class_of(x).unwrap();
            prop_assert!(c >= x);
            prop_assert_eq!(c % PAGE, 0);
            if x <= 16 * PAGE {
                prop_assert_eq!(c, x.next_multiple_of(PAGE), "no rounding beyond the page up to 16 pages");
            } else {
                prop_assert!(8 * (c - x) < x, "class {} wastes 12.5% or more of {}", c, x);
            }
            if x > 8 * PAGE {
                prop_assert!(8 * (c - x) < x, "class {} wastes 12.5% or more of {}", c, x);
            }
            prop_assert_eq!(p.class_of(c), Some(c));
            prop_assert!(c <= x.next_power_of_two().max(PAGE));
        }
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(p.class_of(lo).unwrap() <= p.class_of(hi).unwrap());
    }
}

// ---- Unit tests ------------------------------------------------------------------------------------

#[test]
fn a_block_given_back_idle_is_cached_and_hit_without_device_calls() {
    let sim = Sim::new(1);
    let mut p = pool(16);
    let (b, lease) = pin_new(&mut p, &sim, 5000, 7);
    p.give_back(b, lease, Track::new());
    assert_eq!(p.stats().cached, 2 * PAGE);
    assert_eq!(p.pending_bytes(), 0);
    let (b, lease) = hit(&mut p, &sim, 6000);
    assert_eq!(b, 7);
    assert_eq!((lease.bytes(), lease.requested()), (2 * PAGE, 6000));
    assert_eq!(sim.counts(), Counts::default());
    let s = p.stats();
    assert_eq!(
        (s.hits, s.misses, s.in_use, s.requested_in_use),
        (1, 1, 2 * PAGE, 6000)
    );
    p.assert_consistent();
}

#[test]
fn a_block_is_reused_only_after_every_use_on_every_stream_completed() {
    let sim = Sim::new(2);
    let mut p = pool(16);
    let (b, lease) = pin_new(&mut p, &sim, PAGE, 1);
    let mut track = written(&sim, b, 0);
    work(&sim, &mut track, b, 1, Access::Read);
    p.give_back(b, lease, track);
    assert_eq!(p.pending_bytes(), PAGE);
    assert_eq!(p.stats().cached, 0);

    // Nothing has run: a request of the class pins anew.
    assert!(miss(&mut p, &sim, PAGE).is_empty());
    // The write has run, the read waits on stream 1.
    sim.finish(0);
    assert!(miss(&mut p, &sim, PAGE).is_empty());
    assert_eq!(p.pending_bytes(), PAGE);
    sim.finish(1);
    assert!(sim.idle(b));
    let (again, _lease) = hit(&mut p, &sim, PAGE);
    assert_eq!(again, b);
    assert_eq!(p.pending_bytes(), 0);
    let s = p.stats();
    assert_eq!((s.hits, s.misses, s.failed_pins), (1, 3, 2));
    p.assert_consistent();
}

#[test]
fn every_pending_block_is_polled_so_a_slow_stream_holds_back_only_its_own() {
    let sim = Sim::new(2);
    let mut p = pool(16);
    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, PAGE, 2);
    let (c, lease_c) = pin_new(&mut p, &sim, 2 * PAGE, 3);
    // `a` (oldest) waits on stream 0, `b` and `c` on stream 1, which completes.
    p.give_back(a, lease_a, written(&sim, a, 0));
    p.give_back(b, lease_b, written(&sim, b, 1));
    p.give_back(c, lease_c, written(&sim, c, 1));
    sim.finish(1);
    // A request of `c`'s class polls all three and caches `b` and `c` on the way.
    assert_eq!(hit(&mut p, &sim, 2 * PAGE).0, c);
    assert_eq!(p.stats().cached, PAGE);
    assert_eq!(p.pending_bytes(), PAGE);
    assert_eq!(hit(&mut p, &sim, PAGE).0, b);
    assert!(!sim.idle(a));
    p.assert_consistent();
}

#[test]
fn a_failed_query_keeps_the_block_pending_and_the_others_are_still_polled() {
    let sim = Sim::new(2);
    let mut p = pool(16);
    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, PAGE, 2);
    p.give_back(a, lease_a, written(&sim, a, 0));
    p.give_back(b, lease_b, written(&sim, b, 1));
    sim.finish(0);
    sim.finish(1);
    // Polling `a` records its event, which fails; `b` is still polled, and cached.
    sim.fail_next();
    assert_eq!(p.take(&sim, 3 * PAGE).unwrap_err(), Injected);
    assert_eq!(p.pending_bytes(), PAGE);
    assert_eq!(p.stats().cached, PAGE);
    let s = p.stats();
    assert_eq!(
        (s.hits, s.misses, s.reserving),
        (0, 2, 0),
        "nothing handed out"
    );
    // `a` was never seen idle, so it is not reused yet; the next poll finds it idle.
    assert_eq!(hit(&mut p, &sim, PAGE).0, b);
    assert_eq!(hit(&mut p, &sim, PAGE).0, a);
    p.assert_consistent();
}

#[test]
fn a_miss_evicts_least_recently_used_blocks_of_other_classes_only_as_needed() {
    let sim = Sim::new(1);
    let mut p = pool(10);
    let mut held: Vec<_> = (1..=3)
        .map(|n| pin_new(&mut p, &sim, n * PAGE, n as u32))
        .collect();
    for (b, lease) in held.drain(..) {
        p.give_back(b, lease, Track::new());
    }
    assert_eq!(p.cached_classes(), [PAGE, 2 * PAGE, 3 * PAGE]);
    // Using the 1-page block makes it the most recently used.
    let (b, lease) = hit(&mut p, &sim, PAGE);
    p.give_back(b, lease, Track::new());
    assert_eq!(p.cached_classes(), [2 * PAGE, 3 * PAGE, PAGE]);
    // 6 pages reserved, 5 asked: 1 page over, so the least recently used block (2 pages) goes.
    assert_eq!(miss(&mut p, &sim, 5 * PAGE), [2]);
    assert_eq!(p.cached_classes(), [3 * PAGE, PAGE]);
    // 4 reserved, 6 fits, 7 needs both.
    assert!(miss(&mut p, &sim, 6 * PAGE).is_empty());
    assert_eq!(miss(&mut p, &sim, 10 * PAGE), [3, 1]);
    let s = p.stats();
    assert_eq!(
        (s.evictions, s.reserved, s.cached, s.peak_reserved),
        (3, 0, 0, 10 * PAGE)
    );
    p.assert_consistent();
}

#[test]
fn a_pin_cancelled_before_it_starts_caches_its_evicted_blocks_again() {
    let sim = Sim::new(1);
    let mut p = pool(3);
    for (bytes, id) in [(PAGE, 1), (2 * PAGE, 2)] {
        let (b, lease) = pin_new(&mut p, &sim, bytes, id);
        p.give_back(b, lease, Track::new());
    }
    let before = p.stats();
    let Ok(Take::Pin { reservation, evict }) = p.take(&sim, 3 * PAGE) else {
        panic!("expected a pin");
    };
    assert_eq!(evict, [1, 2]);
    let classes = [PAGE, 2 * PAGE];
    p.unpin_cancelled(reservation, evict.into_iter().zip(classes));
    let s = p.stats();
    assert_eq!((s.reserved, s.cached, s.reserving), (3 * PAGE, 3 * PAGE, 0));
    assert_eq!(
        (s.evictions, s.misses, s.failed_pins),
        (before.evictions, before.misses + 1, before.failed_pins + 1)
    );
    // Both serve their classes again, with no pin.
    assert_eq!(hit(&mut p, &sim, 2 * PAGE).0, 2);
    assert_eq!(hit(&mut p, &sim, PAGE).0, 1);
    p.assert_consistent();
}

#[test]
fn a_cached_block_of_another_class_never_serves_a_request() {
    let sim = Sim::new(1);
    let mut p = pool(3);
    let (b, lease) = pin_new(&mut p, &sim, 2 * PAGE, 1);
    p.give_back(b, lease, Track::new());
    // A 1-page request would waste half of the 2-page block: it pins, and there is room for both.
    assert!(miss(&mut p, &sim, PAGE).is_empty());
    // A 3-page request evicts the 2-page block.
    assert_eq!(miss(&mut p, &sim, 3 * PAGE), [1]);
}

#[test]
fn exhausted_when_blocks_in_use_or_pending_leave_no_room_and_nothing_is_evicted() {
    let sim = Sim::new(1);
    let mut p = pool(4);
    let (a, lease_a) = pin_new(&mut p, &sim, 2 * PAGE, 1);
    let (c, lease_c) = pin_new(&mut p, &sim, PAGE, 2);
    p.give_back(c, lease_c, Track::new());
    // 2 pages in use and 1 cached: 2 more would fit only if... 2 + 2 = 4 fits, evicting the cached page.
    assert_eq!(miss(&mut p, &sim, 2 * PAGE), [2]);
    // In use, 2 pages; 3 more cannot fit.
    assert!(matches!(p.take(&sim, 3 * PAGE), Ok(Take::Exhausted)));
    assert_eq!(p.pending_bytes(), 0);
    // Given back with work in flight, the block is pending: waiting can help.
    p.give_back(a, lease_a, written(&sim, a, 0));
    assert!(matches!(p.take(&sim, 3 * PAGE), Ok(Take::Exhausted)));
    assert_eq!(p.pending_bytes(), 2 * PAGE);
    assert_eq!(p.stats().evictions, 1);
    assert!(wait_for_any(&mut p, &sim).unwrap());
    assert!(sim.idle(a));
    assert_eq!(miss(&mut p, &sim, 3 * PAGE), [1]);
    p.assert_consistent();
}

#[test]
fn requests_above_the_budget_are_refused_at_once() {
    let sim = Sim::new(1);
    let mut p = pool(4);
    assert_eq!(p.config().budget, 4 * PAGE);
    let (b, lease) = pin_new(&mut p, &sim, PAGE, 1);
    p.give_back(b, lease, written(&sim, b, 0));
    let before = p.stats();
    for bytes in [4 * PAGE + 1, 1 << 40, usize::MAX] {
        assert!(matches!(p.take(&sim, bytes), Ok(Take::TooLarge)));
    }
    // No poll, no eviction, no count.
    assert_eq!(sim.counts(), Counts::default());
    assert_eq!(p.stats(), before);
    assert!(miss(&mut p, &sim, 3 * PAGE).is_empty());
}

#[test]
fn reservations_count_against_the_budget_until_pinned_or_failed() {
    let sim = Sim::new(1);
    let mut p = pool(4);
    let Ok(Take::Pin { reservation, .. }) = p.take(&sim, 3 * PAGE) else {
        panic!("expected a pin")
    };
    assert_eq!(
        (reservation.bytes(), reservation.requested()),
        (3 * PAGE, 3 * PAGE)
    );
    assert_eq!(p.stats().reserving, 3 * PAGE);
    assert!(matches!(p.take(&sim, 2 * PAGE), Ok(Take::Exhausted)));
    p.pin_failed(reservation);
    let s = p.stats();
    assert_eq!(
        (s.reserving, s.reserved, s.failed_pins, s.peak_reserved),
        (0, 0, 1, 3 * PAGE)
    );
    let (_, lease) = pin_new(&mut p, &sim, 2 * PAGE, 1);
    assert_eq!(p.stats().in_use, lease.bytes());
}

#[test]
fn the_marks_to_wait_for_are_the_oldest_pending_blocks_and_waiting_needs_no_state() {
    let sim = Sim::new(2);
    let mut p = pool(16);
    assert!(p.oldest_pending_marks().is_none());
    assert!(!wait_for_any(&mut p, &sim).unwrap());
    assert_eq!(sim.counts(), Counts::default());

    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, PAGE, 2);
    let (c, lease_c) = pin_new(&mut p, &sim, PAGE, 3);
    // `a` written on stream 0 and read on stream 1; `b` and `c` written on stream 1.
    let mut track_a = written(&sim, a, 0);
    work(&sim, &mut track_a, a, 1, Access::Read);
    p.give_back(a, lease_a, track_a);
    p.give_back(b, lease_b, written(&sim, b, 1));
    p.give_back(c, lease_c, written(&sim, c, 1));

    // The oldest block's two entries, cloned: nothing recorded, queried or waited for, nothing forgotten.
    let counts = sim.counts();
    let marks = p.oldest_pending_marks().unwrap();
    assert_eq!(
        marks.iter().map(|&(stream, _)| stream).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(sim.counts(), counts);
    assert_eq!(p.pending_bytes(), 3 * PAGE);

    // The state is not needed while they are waited for: other requests go on meanwhile (in the pool, other
    // threads' requests, the lock being let go).
    let (d, lease_d) = pin_new(&mut p, &sim, 2 * PAGE, 4);
    p.give_back(d, lease_d, Track::new());
    for (stream, mark) in &marks {
        sim.synchronize(stream, mark).unwrap();
    }
    assert!(sim.idle(a));
    assert!(!sim.idle(b), "only the work up to `a`'s read ran");
    // The next request polls the pending blocks and finds `a` idle.
    assert_eq!(hit(&mut p, &sim, PAGE).0, a);
    assert_eq!((p.pending_bytes(), p.stats().cached), (2 * PAGE, 2 * PAGE));
    // Next in line: `b`, written on stream 1.
    let marks = p.oldest_pending_marks().unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].0, 1);
    p.assert_consistent();
}

#[test]
fn wait_for_any_returns_at_once_if_a_block_is_idle_else_waits_for_the_oldest() {
    let sim = Sim::new(2);
    let mut p = pool(16);
    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, PAGE, 2);
    let (c, lease_c) = pin_new(&mut p, &sim, PAGE, 3);
    p.give_back(a, lease_a, written(&sim, a, 0));
    p.give_back(b, lease_b, written(&sim, b, 1));
    p.give_back(c, lease_c, written(&sim, c, 1));
    sim.finish(1);
    assert!(wait_for_any(&mut p, &sim).unwrap());
    assert_eq!(sim.counts().syncs, 0, "b and c were idle: no blocking");
    assert_eq!(p.pending_bytes(), PAGE);

    // Only `a` is left, and its stream has not run: a failed synchronize keeps it pending.
    // Its poll (a query) succeeds, its synchronize fails.
    sim.fail_after(1);
    assert_eq!(wait_for_any(&mut p, &sim), Err(Injected));
    assert_eq!(sim.counts().syncs, 1);
    assert_eq!(p.pending_bytes(), PAGE);
    assert!(!sim.idle(a));
    assert!(wait_for_any(&mut p, &sim).unwrap());
    assert!(sim.idle(a));
    assert_eq!((p.pending_bytes(), p.stats().cached), (0, 3 * PAGE));
    assert!(!wait_for_any(&mut p, &sim).unwrap());
    p.assert_consistent();
}

#[test]
fn trim_removes_every_idle_block_and_keeps_the_pending_ones() {
    let sim = Sim::new(1);
    let mut p = pool(16);
    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, 2 * PAGE, 2);
    let (c, lease_c) = pin_new(&mut p, &sim, 3 * PAGE, 3);
    let (_d, lease_d) = pin_new(&mut p, &sim, 4 * PAGE, 4);
    p.give_back(a, lease_a, Track::new());
    p.give_back(b, lease_b, Track::new());
    p.give_back(c, lease_c, written(&sim, c, 0));
    let mut trimmed = p.trim();
    trimmed.sort();
    assert_eq!(trimmed, [1, 2]);
    let s = p.stats();
    assert_eq!(
        (s.cached, s.pending, s.in_use, s.reserved, s.trimmed),
        (0, 3 * PAGE, lease_d.bytes(), 7 * PAGE, 2)
    );
    assert!(p.trim().is_empty());
    p.assert_consistent();
}

#[test]
fn stats_show_the_waste_of_the_classes() {
    let sim = Sim::new(1);
    let mut p = pool(64);
    let (_, l1) = pin_new(&mut p, &sim, PAGE + 1, 1);
    let (_, l2) = pin_new(&mut p, &sim, 17 * PAGE, 2);
    let s = p.stats();
    assert_eq!(s.requested_in_use, 18 * PAGE + 1);
    assert_eq!(s.in_use, 2 * PAGE + 18 * PAGE);
    assert_eq!(s.reserved, l1.bytes() + l2.bytes());
    assert_eq!(s.peak_reserved, s.reserved);
}

#[test]
fn a_hit_serves_the_most_recently_cached_block_of_the_class() {
    let sim = Sim::new(1);
    let mut p = pool(16);
    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, PAGE, 2);
    p.give_back(a, lease_a, Track::new());
    p.give_back(b, lease_b, Track::new());
    assert_eq!(hit(&mut p, &sim, 1).0, b);
    assert_eq!(hit(&mut p, &sim, 1).0, a);
}

#[test]
fn drain_hands_out_the_idle_blocks_and_the_pending_ones_with_their_work() {
    let sim = Sim::new(1);
    let mut p = pool(16);
    let (a, lease_a) = pin_new(&mut p, &sim, PAGE, 1);
    let (b, lease_b) = pin_new(&mut p, &sim, 2 * PAGE, 2);
    let (_c, lease_c) = pin_new(&mut p, &sim, 3 * PAGE, 3);
    p.give_back(a, lease_a, Track::new());
    p.give_back(b, lease_b, written(&sim, b, 0));
    let mut drained = p.drain();
    assert_eq!(drained.idle, [a]);
    assert_eq!(drained.pending.len(), 1);
    let pending = &mut drained.pending[0];
    assert_eq!((pending.block, pending.bytes), (b, 2 * PAGE));
    assert!(!pending.track.is_idle(&sim).unwrap());
    let s = p.stats();
    assert_eq!((s.cached, s.pending, s.reserved), (0, 0, lease_c.bytes()));
    p.assert_consistent();
}

// ---- Random programs against the simulated device ---------------------------------------------------

fn step() -> impl Strategy<Value = Step> {
    // Few distinct sizes, so that classes repeat and blocks are reused; some above any budget.
    let bytes = prop_oneof![
        4 => prop::sample::select(vec![1, PAGE, PAGE + 1, 3 * PAGE, 5 * PAGE - 7, 20 * PAGE]),
        1 => 1..=40 * PAGE,
        1 => Just(1 << 30),
    ];
    prop_oneof![
        6 => bytes.prop_map(|bytes| Step::Take { bytes }),
        4 => (0..8usize, prop::bool::weighted(0.8))
            .prop_map(|(reservation, ok)| Step::Resolve { reservation, ok }),
        6 => (0..8usize, 0..STREAMS, any::<bool>())
            .prop_map(|(holder, stream, write)| Step::Use { holder, stream, write }),
        4 => (0..8usize).prop_map(|holder| Step::GiveBack { holder }),
        5 => (0..STREAMS, 1..4usize).prop_map(|(stream, ops)| Step::Advance { stream, ops }),
        1 => Just(Step::WaitForAny),
        1 => Just(Step::Poll),
        1 => Just(Step::Trim),
        1 => Just(Step::Drain),
    ]
}

fn program() -> impl Strategy<Value = Program> {
    (
        1..=48usize,
        prop::collection::vec(step(), 1..=120),
        prop_oneof![3 => Just(0u64), 1 => 5..20u64],
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(
            |(budget_pages, steps, fail_one_in, seed, wait_at_end)| Program {
                budget: budget_pages * PAGE,
                steps,
                fail_one_in,
                seed,
                wait_at_end,
            },
        )
}

// proptest's default of 256 cases; set PROPTEST_CASES for a longer search.
proptest! {
    /// Whatever the program and the device's schedule: the budget holds, a block is handed out, evicted,
    /// trimmed or drained idle only when it was given back, nobody holds it, and all device work on it has run;
    /// the stats match the model's; nothing leaks (see `fuzzing::pool::run`).
    #[test]
    fn random_programs_keep_the_pool_safe_and_its_books_exact(program in program()) {
        run(&program);
    }
}
