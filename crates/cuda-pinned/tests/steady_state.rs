//! Loops that never pause (the crate's rule "Bounded in steady state"). The driver's unpinning waits for every device to be idle, so
//! the crate unpins only once they are; while another stream is busy at every moment that never happens, and
//! page-locked memory dropped in a loop would pile up. Here every way of getting page-locked memory the crate
//! has (a pool, a gatherer's staging, staged transfers, a prefetcher, plain `Pinned`, `Registered`) runs
//! thousands of iterations beside a stream kept busy, and the page-locked memory the process holds must stay
//! within what one iteration holds live, plus the size classes' rounding (at most 12.5%) and the pools' budgets.
//!
//! On the simulated driver, 2,000 iterations under a page-locked limit of 16 MiB, the process's page-locked
//! bytes read after every iteration. On a GPU, 10,000 iterations, the process's page-locked allocations read
//! from `/proc/self/smaps` every 100 (the driver maps them as shared mappings of `/dev/zero`). Registered memory
//! shows in no counter there, so the process's resident memory is watched too (within the same bound and 64 MiB
//! for the loop's own memory): registrations that pile up keep their pages allocated, and so do the pool's blocks
//! where it pins by registering.

mod common;

use std::time::{Duration, Instant};

use common::{Serial, device, release_spins, serial, spin_for};
use cuda_pinned::{
    Context, DeviceBuffer, GatherOptions, Gatherer, Pinned, PinnedPool, Prefetcher, Registered,
    Stream,
};

const MIB: usize = 1 << 20;
/// The simulated driver's page-locked limit for this binary.
#[cfg(not(feature = "gpu"))]
const LIMIT: u64 = 16 << 20;
const ITERATIONS: usize = if common::SIMULATED { 2_000 } else { 10_000 };
/// How often the page-locked total is read: every iteration on the simulated driver; on a GPU reading
/// `/proc/self/smaps` costs about a millisecond.
const READ_EVERY: usize = if common::SIMULATED { 1 } else { 100 };

fn setup() -> Serial {
    #[cfg(not(feature = "gpu"))]
    cuda_pinned_sim::install_with(cuda_pinned_sim::Settings::new().pinned_limit(LIMIT))
        .unwrap_or_else(|e| panic!("{e}"));
    serial()
}

/// Device 0's context, after what a process does once: a pool's first pin measures the faster way of pinning
/// by pinning 32 MiB each way, and what it leaves is unpinned before the loop's measure is taken.
fn context() -> Context {
    let ctx = device(0);
    let pool = PinnedPool::new(&ctx, MIB);
    drop(pool.alloc::<u8>(MIB).unwrap());
    drop(pool);
    ctx.synchronize().unwrap();
    ctx
}

/// Keeps a stream of its own busy at every moment while a loop runs: spins of 50 ms, queued so that about a
/// second of them is always ahead (an iteration under compute-sanitizer can take far longer than 50 ms).
struct Busy {
    stream: Stream,
    /// When the spins queued so far end, at the earliest.
    ends: Instant,
}

impl Busy {
    const SPIN: Duration = Duration::from_millis(50);
    const AHEAD: Duration = Duration::from_secs(1);

    fn new(context: &Context) -> Busy {
        let mut busy = Busy {
            stream: Stream::new(context).unwrap(),
            ends: Instant::now(),
        };
        busy.keep();
        busy
    }

    /// Called every iteration: queues spins until a second of them is ahead.
    fn keep(&mut self) {
        let now = Instant::now();
        self.ends = self.ends.max(now);
        while self.ends < now + Busy::AHEAD {
            spin_for(&self.stream, Busy::SPIN);
            self.ends += Busy::SPIN;
        }
    }

    /// Whether the stream is still busy: the loop ran beside work, as the test means it to.
    fn still_busy(&self) -> bool {
        !self.stream.query().unwrap()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        release_spins();
        let _ = self.stream.synchronize();
    }
}

/// Bytes of page-locked memory the process holds now: what the simulated driver counts against its limit,
/// or on a GPU the resident bytes of the driver's page-locked allocations (shared mappings of `/dev/zero`).
fn page_locked() -> u64 {
    #[cfg(not(feature = "gpu"))]
    {
        common::sim().expect("the simulated driver").page_locked()
    }
    #[cfg(feature = "gpu")]
    {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("reading /proc/self/smaps");
        let mut total = 0;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                // A mapping's header: `start-end perms offset dev inode path`.
                inside = line.contains(" rw-s ") && line.ends_with("/dev/zero (deleted)");
            } else if let Some(kb) = line.strip_prefix("Rss:").filter(|_| inside) {
                total += kilobytes(kb);
            }
        }
        total
    }
}

/// The process's resident memory (`VmRSS`): on a GPU, where memory registered in place shows (its pages stay
/// allocated while registered), and the pool's blocks when it pins by registering. Not read on the simulated
/// driver, whose page-locked count has registrations.
#[cfg(feature = "gpu")]
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap();
    kilobytes(line)
}

/// What the resident memory may grow by besides page-locked memory: the loop's own `Vec`s and the allocator's
/// caches.
#[cfg(feature = "gpu")]
const RESIDENT_SLACK: u64 = 64 << 20;

/// `   1234 kB` as bytes.
#[cfg(feature = "gpu")]
fn kilobytes(field: &str) -> u64 {
    let kb = field.trim().trim_end_matches("kB").trim();
    kb.parse::<u64>()
        .unwrap_or_else(|e| panic!("{field:?}: {e}"))
        * 1024
}

/// Watches the page-locked memory of a loop: it may not grow past `bound` bytes over what it was before the
/// loop. On a GPU the resident memory is watched too, with [`RESIDENT_SLACK`] more.
struct Watch {
    what: &'static str,
    iterations: usize,
    bound: u64,
    before: u64,
    most: u64,
    #[cfg(feature = "gpu")]
    resident: (u64, u64),
}

impl Watch {
    fn new(what: &'static str, iterations: usize, bound: usize) -> Watch {
        Watch {
            what,
            iterations,
            bound: bound as u64,
            before: page_locked(),
            most: 0,
            #[cfg(feature = "gpu")]
            resident: (resident(), 0),
        }
    }

    fn check(&mut self, iteration: usize) {
        if !iteration.is_multiple_of(READ_EVERY) && iteration + 1 != self.iterations {
            return;
        }
        let more = page_locked().saturating_sub(self.before);
        self.most = self.most.max(more);
        assert!(
            more <= self.bound,
            "{}: after iteration {iteration} the process holds {more} bytes of page-locked memory more than \
             before the loop, past the bound of {} (what one iteration holds, its rounding and the budgets)",
            self.what,
            self.bound
        );
        #[cfg(feature = "gpu")]
        {
            let more = resident().saturating_sub(self.resident.0);
            self.resident.1 = self.resident.1.max(more);
            assert!(
                more <= self.bound + RESIDENT_SLACK,
                "{}: after iteration {iteration} the process's resident memory grew by {more} bytes, past the \
                 bound of {} and {RESIDENT_SLACK} bytes for the loop's own memory",
                self.what,
                self.bound
            );
        }
    }

    fn report(&self) {
        eprint!(
            "{}: {} iterations, page-locked at most {:.2} MiB more than before (bound {:.2} MiB)",
            self.what,
            self.iterations,
            self.most as f64 / MIB as f64,
            self.bound as f64 / MIB as f64
        );
        #[cfg(feature = "gpu")]
        eprint!(
            ", resident at most {:.2} MiB more",
            self.resident.1 as f64 / MIB as f64
        );
        eprintln!();
    }
}

/// What an iteration holds live at most, rounded up as the size classes may (12.5%).
fn rounded(bytes: usize) -> usize {
    bytes + bytes / 8
}

/// Fails the loop with the iteration and the error's own words.
fn at<T>(what: &str, i: usize, result: cuda_pinned::Result<T>) -> T {
    result.unwrap_or_else(|e| panic!("{what}, iteration {i}: {e}"))
}

/// Runs `step` for each iteration of `0..iterations` beside a stream of `context` kept busy at every moment,
/// watching the page-locked memory against `bound` (see [`Watch`]); then checks that the stream was busy
/// throughout, reports, and lets the device go idle.
fn beside_busy_work(
    context: &Context,
    what: &'static str,
    iterations: usize,
    bound: usize,
    mut step: impl FnMut(usize),
) {
    let mut busy = Busy::new(context);
    let mut watch = Watch::new(what, iterations, bound);
    for i in 0..iterations {
        busy.keep();
        step(i);
        watch.check(i);
    }
    assert!(
        busy.still_busy(),
        "the other stream went idle during the loop"
    );
    watch.report();
    drop(busy);
    context.synchronize().unwrap();
}

#[test]
fn a_pool_cycling_size_classes_stays_within_its_budget() {
    let _serial = setup();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let budget = 4 * MIB;
    let pool = PinnedPool::new(&ctx, budget);
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, 4 * MIB).unwrap();
    let bound = budget + rounded(4 * MIB);
    beside_busy_work(&ctx, "a 4 MiB pool", ITERATIONS, bound, |i| {
        // Requests of 4, 2 and 1 MiB in turn: each needs another size class, so the pool evicts.
        let len = [4, 2, 1][i % 3] * MIB;
        let mut host = at("allocating from the pool", i, pool.alloc::<u8>(len));
        at("writing", i, host.as_mut_slice())[len - 1] = i as u8;
        let mut part = device.slice_mut(..len).unwrap();
        at("uploading", i, stream.upload(&host, &mut part));
        at("synchronizing", i, stream.synchronize());
    });
    assert!(pool.stats().evictions > 0, "the loop made the pool evict");
}

#[test]
fn plain_pinned_buffers_allocated_every_iteration_reuse_memory_whose_work_completed() {
    let _serial = setup();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, 4 * MIB).unwrap();
    let bound = rounded(4 * MIB);
    beside_busy_work(&ctx, "Pinned per iteration", ITERATIONS, bound, |i| {
        let len = [4, 2, 1][i % 3] * MIB - 100 * (i % 7);
        let mut host = at("allocating", i, Pinned::<u8>::zeroed(&ctx, len));
        let slice = at("writing", i, host.as_mut_slice());
        assert!(
            slice.iter().step_by(4096).all(|&b| b == 0),
            "zeroed memory, iteration {i}"
        );
        slice.fill(i as u8);
        let mut part = device.slice_mut(..len).unwrap();
        at("uploading", i, stream.upload(&host, &mut part));
        at("synchronizing", i, stream.synchronize());
    });
}

#[test]
fn registered_vecs_of_every_iteration_stay_bounded() {
    let _serial = setup();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let len = 2 * MIB;
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, len).unwrap();
    let mut back = Pinned::<u8>::zeroed(&ctx, 1).unwrap();
    let bound = rounded(len);
    beside_busy_work(&ctx, "Registered per iteration", ITERATIONS, bound, |i| {
        let host = at("registering", i, Registered::new(&ctx, vec![i as u8; len]));
        at("uploading", i, stream.upload(&host, &mut device));
        // The last byte comes back: the upload read this iteration's contents.
        let mut last = back.slice_mut(..).unwrap();
        at(
            "downloading",
            i,
            stream.download(&device.slice(len - 1..).unwrap(), &mut last),
        );
        assert_eq!(
            at("reading", i, back.as_slice())[0],
            i as u8,
            "iteration {i}"
        );
    });
}

#[test]
fn a_gatherer_whose_staging_is_too_small_reuses_the_buffers_it_pins() {
    let _serial = setup();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let rows = 4096;
    let table = Registered::new(&ctx, (0..rows as u32).collect::<Vec<u32>>()).unwrap();
    let staging = 256 << 10;
    let gatherer = Gatherer::with_staging(&ctx, staging).unwrap();
    // 512 KiB of indices per gather: more than the staging holds, so each gather pins a buffer of its own.
    let count = 128 << 10;
    let mut out = DeviceBuffer::<u32>::zeroed(&stream, count).unwrap();
    let mut back = Pinned::<u32>::zeroed(&ctx, count).unwrap();
    let what = "a gatherer with 256 KiB of staging";
    let bound = staging + rounded(count * 4);
    beside_busy_work(&ctx, what, ITERATIONS / 4, bound, |i| {
        let indices: Vec<u32> = (0..count).map(|k| ((k * 7 + i) % rows) as u32).collect();
        let options = GatherOptions::default();
        let gathered = gatherer.gather(&stream, &table, 1, &indices, &mut out, options);
        at("gathering", i, gathered);
        if i % 64 == 0 {
            at("downloading", i, stream.download(&out, &mut back));
            assert_eq!(
                at("reading", i, back.as_slice()),
                indices.as_slice(),
                "gather {i}"
            );
        }
        at("synchronizing", i, stream.synchronize());
    });
}

#[test]
fn staged_transfers_stay_within_their_pool() {
    let _serial = setup();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let budget = 4 * MIB;
    let pool = PinnedPool::new(&ctx, budget);
    let len = 3 * MIB;
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, len).unwrap();
    let mut back = vec![0u8; len];
    let what = "staged transfers through a 4 MiB pool";
    beside_busy_work(&ctx, what, ITERATIONS / 4, budget, |i| {
        let src = vec![i as u8; len - i % 4096];
        let n = src.len();
        let mut part = device.slice_mut(..n).unwrap();
        at("uploading", i, stream.upload_staged(&pool, &src, &mut part));
        at(
            "downloading",
            i,
            stream.download_staged(&pool, &device.slice(..n).unwrap(), &mut back[..n]),
        );
        assert!(back[..n] == src[..], "iteration {i}");
    });
}

#[test]
fn a_prefetcher_stays_within_its_pool() {
    let _serial = setup();
    let ctx = context();
    let compute = Stream::new(&ctx).unwrap();
    let budget = 4 * MIB;
    let pool = PinnedPool::new(&ctx, budget);
    let len = 64 << 10;
    let mut batches = Prefetcher::<Pinned<u32>>::builder(&pool, &compute, len)
        .batches(ITERATIONS)
        .workers(2)
        .build(|i, batch| {
            batch.as_mut_slice()?.fill(i as u32);
            Ok(())
        })
        .unwrap();
    let mut scratch = DeviceBuffer::<u32>::zeroed(&compute, len).unwrap();
    let what = "a prefetcher over a 4 MiB pool";
    beside_busy_work(&ctx, what, ITERATIONS, budget, |i| {
        let batch = at(
            "prefetching",
            i,
            batches.next().expect("a batch per iteration"),
        );
        assert_eq!(batch.index(), i, "batches in order");
        at("using a batch", i, compute.copy(&*batch, &mut scratch));
    });
    assert!(batches.next().is_none(), "every batch was used");
}
