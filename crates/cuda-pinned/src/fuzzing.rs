//! Internals for the fuzz targets in `fuzz/` only. **Not a stable API**: hidden from the docs, outside semver,
//! and free to change or go in any release; nothing outside this repository should use it.
//!
//! Everything here is pure: no GPU, no driver call, no unsafe.
//! - [`pool`]: programs run against the pinned pool's state machine (`memory/pool/state.rs`) on the simulated
//!   device of `track/sim.rs`, checked step by step against a model of where every block is. The pool's
//!   property test runs the same model on programs of its own.
//! - [`ranges`]: the range check of buffer views (`memory/view.rs`) and how a staged transfer splits into chunks
//!   and workers (`staging/options.rs`).
//! - [`load`]: how a file load cuts byte ranges into read requests and uploads (`load/plan.rs`), and the check of a
//!   safetensors file's header (`load/safetensors.rs`, feature `safetensors`).

pub mod pool {
    //! Random programs against the pool's `PoolState` on a simulated device, and the model they are checked
    //! against: [`run`] panics where the pool breaks one of its invariants.

    use std::collections::{HashMap, HashSet};

    use crate::memory::pool_state::{Config, Lease, PoolState, Reservation, Take};
    use crate::track::sim::{self, Injected, Payload};
    use crate::track::{Access, Timeline, Tracker};

    /// The host page size of the programs' pools.
    pub const PAGE: usize = 4096;

    /// The streams of the simulated device; stream indices are taken modulo this.
    pub const STREAMS: usize = 3;

    /// A use on the simulated device is tagged with the block it touches; nothing is checked as it runs.
    impl Payload for u32 {}

    /// The shared simulated device, its uses tagged with blocks.
    pub(crate) type Sim = sim::Sim<u32>;

    /// A block's tracker, over the simulated device's streams and events.
    pub(crate) type Track = Tracker<usize, usize>;

    /// The pool state of the programs: blocks numbered, on the simulated device.
    pub(crate) type Pool = PoolState<u32, usize, usize>;

    impl Sim {
        /// Whether every use of `block` enqueued so far has run: the only state in which the pool may hand it
        /// out again or have it unpinned.
        pub(crate) fn idle(&self, block: u32) -> bool {
            self.uses().iter().all(|u| u.payload != block || u.executed)
        }
    }

    /// What the pool does to make room from pending blocks once `take` said `Exhausted`: polls them all, and
    /// if none was idle, waits for the marks of the oldest (outside the pool's lock, in the pool) and polls
    /// again. Whether a block was cached; `Ok(false)` only when nothing is pending.
    ///
    /// # Errors
    /// The first failed device call; the block it concerned stays pending.
    pub(crate) fn wait_for_any(pool: &mut Pool, sim: &Sim) -> Result<bool, Injected> {
        if pool.pending_bytes() == 0 {
            assert!(pool.oldest_pending_marks().is_none());
            return Ok(false);
        }
        if pool.poll_pending(sim)? > 0 {
            return Ok(true);
        }
        let marks = pool
            .oldest_pending_marks()
            .expect("pending bytes without a pending block");
        assert!(!marks.is_empty(), "a pending block with nothing in flight");
        for (stream, mark) in &marks {
            sim.synchronize(stream, mark)?;
        }
        let cached = pool.poll_pending(sim)?;
        assert!(
            cached > 0,
            "the oldest pending block is not idle after its marks"
        );
        Ok(true)
    }

    /// Device work on `block` as a buffer enqueues it: prepare, enqueue, record_use. Nothing is enqueued if
    /// `prepare` fails.
    pub(crate) fn work(sim: &Sim, track: &mut Track, block: u32, stream: usize, access: Access) {
        if track.prepare(sim, &stream, access).is_ok() {
            sim.enqueue(stream, block);
            track.record_use(&stream, &sim.mark(stream), access);
        }
    }

    /// One step of a program. Indices are taken modulo the number of candidates; a step with no candidate
    /// does nothing.
    #[derive(Debug, Clone)]
    pub enum Step {
        /// `take(bytes)`; a reservation is kept until a `Resolve`.
        Take {
            /// The bytes requested.
            bytes: usize,
        },
        /// Completes a pin in progress (`pinned`, as a new block) or fails it (`pin_failed`).
        Resolve {
            /// Which reservation.
            reservation: usize,
            /// Whether the pin succeeded.
            ok: bool,
        },
        /// The holder of a block enqueues work on it.
        Use {
            /// Which holder.
            holder: usize,
            /// On which stream.
            stream: usize,
            /// A write, else a read.
            write: bool,
        },
        /// The holder gives its block back, with its tracker (and the work recorded in it).
        GiveBack {
            /// Which holder.
            holder: usize,
        },
        /// The device runs up to `ops` ops of `stream` (work, event records, waits), stopping early where the
        /// stream is empty or blocked.
        Advance {
            /// Which stream.
            stream: usize,
            /// How many ops at most.
            ops: usize,
        },
        /// Waits for room as the pool does (`wait_for_any`): polls the pending blocks, and if none is idle
        /// waits for the marks of the oldest (`PoolState::oldest_pending_marks`).
        WaitForAny,
        /// `poll_pending`.
        Poll,
        /// `trim`: the cached blocks are unpinned.
        Trim,
        /// `drain`, as when the pool is dropped: the idle blocks are unpinned, the pending ones kept until
        /// their work has run. The program goes on with the emptied pool.
        Drain,
    }

    /// A program: a pool, a device, and the steps to run on them.
    #[derive(Debug, Clone)]
    pub struct Program {
        /// The pool's budget in bytes (need not be a multiple of [`PAGE`]).
        pub budget: usize,
        /// What to do.
        pub steps: Vec<Step>,
        /// Inject a failure into one `Timeline` call in this many, at random (0: none; 1: every call).
        pub fail_one_in: u64,
        /// The seed of those failures.
        pub seed: u64,
        /// Whether the wind-down waits for every pending block (`wait_for_any` until none is left) before
        /// the final `drain`, rather than draining them pending.
        pub wait_at_end: bool,
    }

    /// A block in a holder's hands.
    struct Held {
        block: u32,
        lease: Lease,
        track: Track,
    }

    /// What the model knows independently of the pool: where every block is, and what the counters must say.
    /// Blocks are numbered from 1 as they are pinned; each is held, returned or gone.
    #[derive(Default)]
    struct Model {
        held: Vec<Held>,
        /// Given back and not yet handed out or removed (pending or cached): block to class.
        returned: HashMap<u32, usize>,
        /// Evicted, trimmed or drained: out of the pool for good.
        gone: HashSet<u32>,
        /// Drained while pending: to be released once their work has run.
        drained: Vec<(u32, Track)>,
        reservations: Vec<Reservation>,
        /// The last block pinned: blocks `1..=pinned` exist.
        pinned: u32,
        hits: u64,
        misses: u64,
        failed_pins: u64,
        evictions: u64,
        trimmed: u64,
        peak: usize,
    }

    impl Model {
        fn in_use(&self, block: u32) -> bool {
            self.held.iter().any(|h| h.block == block)
        }

        /// A block the pool gave up (hit, eviction, trim, drain), idle or not: it must have been given back,
        /// not be held by anyone, and not have left the pool before. Returns its class.
        fn leaves_pool(&mut self, block: u32, what: &str) -> usize {
            assert!(!self.in_use(block), "{what}: block {block} is in use");
            assert!(
                !self.gone.contains(&block),
                "{what}: block {block} already left the pool"
            );
            self.returned
                .remove(&block)
                .unwrap_or_else(|| panic!("{what}: block {block} was never given back"))
        }

        /// A block the pool removed from its cache (hit, eviction, trim, drain of an idle block): as
        /// [`Model::leaves_pool`], and no device work may be left on it.
        fn leaves_cache(&mut self, sim: &Sim, block: u32, what: &str) -> usize {
            assert!(
                sim.idle(block),
                "{what}: block {block} has device work that has not run"
            );
            self.leaves_pool(block, what)
        }

        /// Drains the pool: the idle blocks are unpinned, the pending ones kept with their trackers.
        fn drain(&mut self, sim: &Sim, pool: &mut Pool, what: &str) {
            let drained = pool.drain();
            for block in drained.idle {
                self.leaves_cache(sim, block, what);
                self.trimmed += 1;
                self.gone.insert(block);
            }
            for pending in drained.pending {
                let class = self.leaves_pool(pending.block, what);
                assert_eq!(class, pending.bytes, "{what}: a pending block's size");
                self.gone.insert(pending.block);
                self.drained.push((pending.block, pending.track));
            }
            let s = pool.stats();
            assert_eq!((s.cached, s.pending), (0, 0), "{what}: left blocks behind");
        }

        /// Checks the pool's stats against the model, after every step.
        fn check(&mut self, pool: &Pool, budget: usize) {
            pool.assert_consistent();
            let s = pool.stats();
            let in_use: usize = self.held.iter().map(|h| h.lease.bytes()).sum();
            let requested: usize = self.held.iter().map(|h| h.lease.requested()).sum();
            let returned: usize = self.returned.values().sum();
            let reserving: usize = self.reservations.iter().map(Reservation::bytes).sum();
            self.peak = self.peak.max(in_use + returned + reserving);
            assert_eq!(s.in_use, in_use, "in use");
            assert_eq!(s.requested_in_use, requested, "requested in use");
            assert_eq!(s.cached + s.pending, returned, "cached + pending");
            assert_eq!(s.reserving, reserving, "reserving");
            assert_eq!(s.reserved, in_use + returned + reserving, "reserved");
            assert_eq!(s.reserved, s.in_use + s.cached + s.pending + s.reserving);
            assert!(
                s.reserved <= budget,
                "reserved {} over the budget {budget}",
                s.reserved
            );
            assert_eq!(s.peak_reserved, self.peak, "peak");
            assert_eq!(
                (s.hits, s.misses, s.failed_pins, s.evictions, s.trimmed),
                (
                    self.hits,
                    self.misses,
                    self.failed_pins,
                    self.evictions,
                    self.trimmed
                ),
                "counters (hits, misses, failed pins, evictions, trimmed)"
            );
            // Nothing leaks: every block pinned is in exactly one place (`leaves_pool` keeps them apart).
            assert_eq!(
                self.held.len() + self.returned.len() + self.gone.len(),
                self.pinned as usize,
                "blocks lost"
            );
        }
    }

    /// Runs `program` against a fresh pool, checking after every step that the budget holds; that a block is
    /// handed out, evicted, trimmed or drained idle only when it was given back, nobody holds it, and all device
    /// work on it has run; that the stats match the model's; and at the end, once everything has come back and
    /// the pool is drained, that every block pinned left it exactly once and that the work on those drained
    /// pending completes.
    ///
    /// # Panics
    /// Where the pool breaks one of those.
    pub fn run(program: &Program) {
        let sim = Sim::with_failures(STREAMS, program.fail_one_in, program.seed);
        let budget = program.budget;
        let mut pool = Pool::new(Config { budget, page: PAGE });
        let mut m = Model::default();
        for step in &program.steps {
            match *step {
                Step::Take { bytes } => {
                    let class = pool.class_of(bytes);
                    match pool.take(&sim, bytes) {
                        Ok(Take::Hit { block, lease }) => {
                            let was = m.leaves_cache(&sim, block, "hit");
                            assert_eq!(Some(was), class, "hit of another class");
                            assert_eq!((lease.bytes(), lease.requested()), (was, bytes));
                            m.hits += 1;
                            m.held.push(Held {
                                block,
                                lease,
                                track: Track::new(),
                            });
                        }
                        Ok(Take::Pin { reservation, evict }) => {
                            assert_eq!(Some(reservation.bytes()), class);
                            assert_eq!(reservation.requested(), bytes);
                            for block in evict {
                                let was = m.leaves_cache(&sim, block, "eviction");
                                assert_ne!(
                                    Some(was),
                                    class,
                                    "evicted a block of the class asked for"
                                );
                                m.evictions += 1;
                                m.gone.insert(block);
                            }
                            m.misses += 1;
                            m.reservations.push(reservation);
                        }
                        Ok(Take::Exhausted) => {
                            let s = pool.stats();
                            let class = class.expect("exhausted for a request with no class");
                            assert!(class <= budget);
                            assert!(
                                class > budget - (s.reserved - s.cached),
                                "exhausted, but {class} bytes fit in {s:?}"
                            );
                        }
                        Ok(Take::TooLarge) => assert!(class.is_none_or(|class| class > budget)),
                        Err(Injected) => {}
                    }
                }
                Step::Resolve { reservation, ok } => {
                    if m.reservations.is_empty() {
                        continue;
                    }
                    let r = m
                        .reservations
                        .swap_remove(reservation % m.reservations.len());
                    if ok {
                        m.pinned += 1;
                        m.held.push(Held {
                            block: m.pinned,
                            lease: pool.pinned(r),
                            track: Track::new(),
                        });
                    } else {
                        m.failed_pins += 1;
                        pool.pin_failed(r);
                    }
                }
                Step::Use {
                    holder,
                    stream,
                    write,
                } => {
                    if m.held.is_empty() {
                        continue;
                    }
                    let n = m.held.len();
                    let h = &mut m.held[holder % n];
                    let access = if write { Access::Write } else { Access::Read };
                    work(&sim, &mut h.track, h.block, stream % STREAMS, access);
                }
                Step::GiveBack { holder } => {
                    if m.held.is_empty() {
                        continue;
                    }
                    let n = m.held.len();
                    let h = m.held.swap_remove(holder % n);
                    m.returned.insert(h.block, h.lease.bytes());
                    pool.give_back(h.block, h.lease, h.track);
                }
                Step::Advance { stream, ops } => {
                    // Only this stream moves, so once it is empty or blocked it stays so.
                    for _ in 0..ops {
                        if !sim.advance(stream % STREAMS) {
                            break;
                        }
                    }
                }
                Step::WaitForAny => {
                    let pending = pool.pending_bytes();
                    match wait_for_any(&mut pool, &sim) {
                        Ok(true) => assert!(pool.pending_bytes() < pending),
                        Ok(false) => assert_eq!(pending, 0),
                        // Polling may have cached some before the failure.
                        Err(Injected) => assert!(pool.pending_bytes() <= pending),
                    }
                }
                Step::Poll => {
                    let pending = pool.pending_bytes();
                    match pool.poll_pending(&sim) {
                        Ok(0) => assert_eq!(pool.pending_bytes(), pending),
                        Ok(_) => assert!(pool.pending_bytes() < pending),
                        Err(Injected) => assert!(pool.pending_bytes() <= pending),
                    }
                }
                Step::Trim => {
                    for block in pool.trim() {
                        m.leaves_cache(&sim, block, "trim");
                        m.trimmed += 1;
                        m.gone.insert(block);
                    }
                    assert_eq!(pool.stats().cached, 0);
                }
                Step::Drain => m.drain(&sim, &mut pool, "drain"),
            }
            m.check(&pool, budget);
        }

        // Wind down: everything comes back and every device call succeeds; then the pool is drained, as when
        // it is dropped, and must have given up every block.
        sim.stop_failing();
        for h in std::mem::take(&mut m.held) {
            m.returned.insert(h.block, h.lease.bytes());
            pool.give_back(h.block, h.lease, h.track);
        }
        for r in std::mem::take(&mut m.reservations) {
            m.failed_pins += 1;
            pool.pin_failed(r);
        }
        m.check(&pool, budget);
        if program.wait_at_end {
            while wait_for_any(&mut pool, &sim)
                .expect("wait_for_any failed with no failure injected")
            {}
            assert_eq!(pool.pending_bytes(), 0);
            m.check(&pool, budget);
        }
        m.drain(&sim, &mut pool, "final drain");
        m.check(&pool, budget);
        assert!(
            m.returned.is_empty(),
            "blocks not drained: {:?}",
            m.returned
        );
        assert_eq!(m.gone.len(), m.pinned as usize, "blocks never given up");
        assert_eq!(pool.stats().reserved, 0);
        // The drained pending blocks are released once their work has run: waiting for it must work, and
        // cover every use of the block.
        for (block, mut track) in std::mem::take(&mut m.drained) {
            track
                .synchronize_all(&sim)
                .expect("synchronize failed with no failure injected");
            assert!(
                sim.idle(block),
                "drained block {block} has work left after its tracker waited"
            );
        }
    }
}

pub mod ranges {
    //! The range and chunk arithmetic: the element range of a view, the length check of a transfer, and the
    //! split of a staged transfer into chunks and workers.

    use std::ops::{Bound, Range};

    use crate::error::Result;
    use crate::staging::{Plan, StagingOptions};

    /// Elements `start..end` of a buffer of `len` elements covered by a view of the range `(start, end)`: the
    /// check of `DeviceBuffer::slice`, `Pinned::slice` and their `_mut` forms.
    ///
    /// # Errors
    /// An invalid-argument error naming the range and `len` if the range is not within the buffer.
    pub fn view_bounds(
        start: Bound<usize>,
        end: Bound<usize>,
        len: usize,
    ) -> Result<(usize, usize)> {
        crate::memory::view_bounds((start, end), len)
    }

    /// The length check of a staged transfer between `host` and `device` elements (`what` names it).
    ///
    /// # Errors
    /// An invalid-argument error naming both lengths if they differ.
    pub fn check_lengths(what: &str, host: usize, device: usize) -> Result<()> {
        crate::staging::check_host_device(what, host, device)
    }

    /// How a staged transfer of `total` bytes with `options` splits.
    ///
    /// # Errors
    /// An invalid-argument error for a chunk size or thread count of zero.
    pub fn staging_plan(total: usize, options: StagingOptions) -> Result<StagingPlan> {
        options.plan(total).map(StagingPlan)
    }

    /// The split of a staged transfer: chunks of at most `chunk_bytes` dealt round-robin to the workers.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct StagingPlan(Plan);

    impl StagingPlan {
        /// The bytes of the transfer.
        #[must_use]
        pub fn total(&self) -> usize {
            self.0.total()
        }

        /// The most bytes of a chunk.
        #[must_use]
        pub fn chunk_bytes(&self) -> usize {
            self.0.chunk_bytes()
        }

        /// How many chunks.
        #[must_use]
        pub fn chunks(&self) -> usize {
            self.0.chunks()
        }

        /// How many worker threads.
        #[must_use]
        pub fn workers(&self) -> usize {
            self.0.workers()
        }

        /// The bytes of chunk `index`; empty at the end for an index past the last.
        #[must_use]
        pub fn chunk(&self, index: usize) -> Range<usize> {
            self.0.chunk(index)
        }

        /// The worker of chunk `index`.
        #[must_use]
        pub fn worker_of(&self, index: usize) -> usize {
            self.0.worker_of(index)
        }

        /// The chunks of `worker`, in order.
        pub fn chunks_of(&self, worker: usize) -> impl Iterator<Item = usize> + use<> {
            self.0.chunks_of(worker)
        }
    }
}

pub mod load {
    //! The pure parts of a file load: [`plan`] cuts byte ranges of a file into aligned read requests, each with
    //! the uploads out of its slot, and checks them (the check the plan's unit tests share); [`read_header`]
    //! reads a safetensors file's header as `SafeTensorsFile::open` does, from the file's bytes.

    #[cfg(feature = "safetensors")]
    use std::collections::HashMap;

    use crate::load::plan::{self, PlanError};
    #[cfg(feature = "safetensors")]
    use crate::load::{TensorInfo, safetensors};

    /// The alignment of a direct read's offset and length; buffered reads are aligned to 1.
    pub const DIRECT_ALIGN: u64 = plan::DIRECT_ALIGN;

    /// Bytes between two wanted ranges that a request reads rather than start a request of its own.
    pub const MERGE_GAP: u64 = plan::MERGE_GAP;

    /// Bytes `[file, file + len)` of the file, which go to destination `dest` from its byte `at`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Piece {
        /// Where the bytes start in the file.
        pub file: u64,
        /// How many.
        pub len: u64,
        /// Which destination they go to.
        pub dest: usize,
        /// Where in the destination.
        pub at: u64,
    }

    /// Why the plan refused pieces: the fields of its error.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Refusal {
        /// Piece `index`, bytes `start..end` (`end` saturated), ends past the file's `file_len` bytes.
        PastEnd {
            /// Which piece.
            index: usize,
            /// Its first byte.
            start: u64,
            /// Its end, saturated at `u64::MAX`.
            end: u64,
            /// The file's length.
            file_len: u64,
        },
        /// Piece `index`, not empty, starts before `previous_end`, the end of the last non-empty piece before it.
        Overlaps {
            /// Which piece.
            index: usize,
            /// Its first byte.
            start: u64,
            /// Where the last non-empty piece before it ends.
            previous_end: u64,
        },
        /// A slot of `slot_bytes` is not a multiple of `align`, or holds fewer than two aligned blocks.
        SlotTooSmall {
            /// The slot's size.
            slot_bytes: usize,
            /// The alignment.
            align: u64,
        },
    }

    /// A refusal, with the file offset the load's error names and its message.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Refused {
        /// What was refused.
        pub refusal: Refusal,
        /// The offset of the error (`PlanError::offset`).
        pub offset: u64,
        /// Its message (`Display`).
        pub message: String,
    }

    /// What a plan made, once checked.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Planned {
        /// How many read requests.
        pub requests: usize,
        /// How many uploads, over all requests.
        pub uploads: usize,
        /// The bytes the requests must read (their `needed`), gaps between merged pieces included.
        pub read: u64,
    }

    /// Plans `pieces` of a file of `file_len` bytes into slots of `slot_bytes`, aligned to `align` (a power of
    /// two), as a load does, and checks the requests: the shared check of the plan's unit tests (each aligned
    /// and within a slot; every byte of every piece uploaded once, in order, from where its request read it, to
    /// where the piece says; no other upload); and further that requests come in increasing file order, that
    /// the bytes each must deliver are within the file and end with its last upload, that a request starts in
    /// the block of its first wanted byte, and that the bytes it reads between two uploads are at most
    /// [`MERGE_GAP`].
    ///
    /// # Errors
    /// The plan's refusal, with its offset and message.
    ///
    /// # Panics
    /// Where the requests break one of those; and, as the plan does, if `align` is not a power of two.
    pub fn plan(
        pieces: &[Piece],
        file_len: u64,
        slot_bytes: usize,
        align: u64,
    ) -> Result<Planned, Refused> {
        let pieces: Vec<plan::Piece> = pieces
            .iter()
            .map(|p| plan::Piece {
                file: p.file,
                len: p.len,
                dest: p.dest,
                at: p.at,
            })
            .collect();
        let requests = plan::plan(&pieces, file_len, slot_bytes, align).map_err(|e| Refused {
            offset: e.offset(),
            message: e.to_string(),
            refusal: match e {
                PlanError::PastEnd {
                    index,
                    start,
                    end,
                    file_len,
                } => Refusal::PastEnd {
                    index,
                    start,
                    end,
                    file_len,
                },
                PlanError::Overlaps {
                    index,
                    start,
                    previous_end,
                } => Refusal::Overlaps {
                    index,
                    start,
                    previous_end,
                },
                PlanError::SlotTooSmall { slot_bytes, align } => {
                    Refusal::SlotTooSmall { slot_bytes, align }
                }
            },
        })?;
        plan::check(&pieces, &requests, slot_bytes, align);
        let mut next = 0;
        for request in &requests {
            assert!(
                request.offset >= next,
                "requests out of file order at {request:?}"
            );
            let needed_end = request.offset + request.needed as u64;
            assert!(
                needed_end <= file_len,
                "{request:?} needs bytes past the end of the file ({file_len} bytes)"
            );
            next = needed_end;
            let first = request.uploads.first().expect("a request with no upload");
            assert!(
                (first.slot_at as u64) < align,
                "{request:?} starts before the block of its first byte"
            );
            let last = request.uploads.last().expect("a request with no upload");
            assert_eq!(
                last.slot_at + last.len,
                request.needed,
                "{request:?} needs bytes after its last upload"
            );
            for pair in request.uploads.windows(2) {
                let end = pair[0].slot_at + pair[0].len;
                assert!(
                    pair[1].slot_at >= end && (pair[1].slot_at - end) as u64 <= MERGE_GAP,
                    "{request:?}: uploads out of order or a gap over {MERGE_GAP} bytes"
                );
            }
        }
        let wanted = pieces.iter().any(|p| p.len > 0);
        assert_eq!(!requests.is_empty(), wanted, "{requests:?} of {pieces:?}");
        Ok(Planned {
            requests: requests.len(),
            uploads: requests.iter().map(|r| r.uploads.len()).sum(),
            read: requests.iter().map(|r| r.needed as u64).sum(),
        })
    }

    /// A safetensors header: its tensors, in file order, and its `__metadata__`.
    #[cfg(feature = "safetensors")]
    pub type Header = (Vec<TensorInfo>, Option<HashMap<String, String>>);

    /// The tensors (in file order) and metadata of the safetensors file whose bytes are `file`, read as
    /// `SafeTensorsFile::open` reads them: the header's length from the first 8 bytes (zeros past the end of a
    /// shorter file) checked against the file's length, then the header parsed and checked against it.
    ///
    /// # Errors
    /// The offset in the file and what is wrong, as the error of `SafeTensorsFile::open` names them.
    #[cfg(feature = "safetensors")]
    pub fn read_header(file: &[u8]) -> Result<Header, (u64, String)> {
        let mut length = [0u8; 8];
        for (to, from) in length.iter_mut().zip(file) {
            *to = *from;
        }
        let n = safetensors::header_length(u64::from_le_bytes(length), file.len() as u64)?;
        let header = &file[8..8 + n as usize];
        safetensors::parse_header(header, file.len() as u64)
    }
}
