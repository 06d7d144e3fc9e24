//! The tracker's unit tests: each ordering rule, host access and failure on a hand-picked schedule.

use super::{Kind, Sim, T, device_use};
use crate::track::Access;
use crate::track::sim::{Counts, Injected, Op};

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
