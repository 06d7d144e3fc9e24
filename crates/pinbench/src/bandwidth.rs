//! Bandwidth of each way of holding the host side of a copy, per size and direction, through the safe layer and
//! through the raw driver call on the same memory; and an upload and a download at the same time.
//!
//! The figures are taken size by size, every method in turn, and the pageable and staged methods of a size copy
//! through one `Vec`: their ratio compares two figures taken seconds apart on the same pages. The staged method
//! copies that `Vec` through pinned buffers of the bench's `PinnedPool`, which is warmed before the figures of
//! each size (and by every figure's warm-up copy), so that pinning is never timed. Below the
//! library's crossover (`StagingOptions::chunked_from`) the staged method is the driver's pageable path, as
//! for any user of `upload_staged`.
//!
//! Every figure is checked once: the source is filled with a pattern of its own seed before the copies, and
//! after them the destination must hold exactly that pattern (a download's destination is overwritten first,
//! so a copy that did nothing shows).

use std::ffi::c_void;

use cuda_pinned::staging::StagingOptions;
use cuda_pinned::{
    Context, DeviceBuffer, DeviceView, DeviceViewMut, Error, Event, Pinned, PinnedBuilder,
    PinnedPool, Registered, Stream, driver_call,
};

use crate::results::{
    Api, Bandwidth, Bidirectional, Direction, Extra, Method, StagedTurns, size_label,
};
use crate::timing::{Plan, Stopwatch, Timed, batching, fill_pattern, median, pattern_mismatch};
use crate::{Bench, Outcome};

/// What a download's destination holds before the copy: not the pattern, not zeros.
const POISON: u8 = 0xA5;

/// The budget of the bench's staging pool ([`crate::Bench::pool`]): room for the buffers of every size measured,
/// so that no figure's transfers make the pool evict (and the crate's release thread unpin) another size's.
pub const STAGING_POOL_BYTES: usize = 1 << 30;

/// The host memory of one method, one transfer long.
pub enum Host {
    /// A `Vec` the driver stages through its own pinned buffer.
    Pageable(Vec<u8>),
    /// A `Vec` staged by the crate through buffers of `pool`: with `upload_staged` / `download_staged` where
    /// `options` is `None` (the default options), else with `upload_staged_with` / `download_staged_with`.
    Staged {
        /// The user's memory.
        data: Vec<u8>,
        /// Where the staging buffers come from.
        pool: PinnedPool,
        /// Chunk size and threads other than the defaults.
        options: Option<StagingOptions>,
    },
    /// `cuMemHostAlloc` memory, default or write-combined.
    Pinned(Pinned<u8>),
    /// A `Vec` pinned in place.
    Registered(Registered<u8>),
}

impl Host {
    /// Allocates `bytes` of `method`'s host memory; a staged method stages through `pool`.
    pub fn new(
        context: &Context,
        pool: &PinnedPool,
        method: Method,
        bytes: usize,
    ) -> Outcome<Host> {
        Ok(match method {
            Method::Pageable => Host::Pageable(vec![0u8; bytes]),
            Method::Staged | Method::StagedChunked => {
                Host::staged(pool, method.staging_options(), bytes)
            }
            Method::Pinned => Host::Pinned(Pinned::zeroed(context, bytes)?),
            Method::PinnedWriteCombined => Host::Pinned(
                PinnedBuilder::new(context)
                    .write_combined(true)
                    .zeroed(bytes)?,
            ),
            Method::Registered => Host::Registered(Registered::new(context, vec![0u8; bytes])?),
        })
    }

    /// `bytes` of ordinary memory staged through `pool` with `options` (`None`: the defaults).
    pub fn staged(pool: &PinnedPool, options: Option<StagingOptions>, bytes: usize) -> Host {
        Host::Staged {
            data: vec![0u8; bytes],
            pool: pool.clone(),
            options,
        }
    }

    /// The memory, for the host to write (waits for device work on it).
    fn write(&mut self) -> Outcome<&mut [u8]> {
        Ok(match self {
            Host::Pageable(v) | Host::Staged { data: v, .. } => v,
            Host::Pinned(p) => p.as_mut_slice()?,
            Host::Registered(r) => r.as_mut_slice()?,
        })
    }

    /// The memory, for the host to read (waits for device writes to it). Slow for write-combined memory.
    fn read(&self) -> Outcome<&[u8]> {
        Ok(match self {
            Host::Pageable(v) | Host::Staged { data: v, .. } => v,
            Host::Pinned(p) => p.as_slice()?,
            Host::Registered(r) => r.as_slice()?,
        })
    }

    /// Whether the CPU reads the memory at normal speed (write-combined memory is uncached).
    fn readable(&self) -> bool {
        !matches!(self, Host::Pinned(p) if p.is_write_combined())
    }

    /// Enqueues an upload of all of it through the safe layer (a pageable one returns when done, a staged one
    /// once every chunk is staged).
    fn upload(&self, stream: &Stream, dst: &mut DeviceViewMut<'_, u8>) -> cuda_pinned::Result<()> {
        match self {
            Host::Pageable(v) => stream.upload_pageable(v, dst),
            Host::Staged {
                data,
                pool,
                options: None,
            } => stream.upload_staged(pool, data, dst),
            Host::Staged {
                data,
                pool,
                options: Some(options),
            } => stream.upload_staged_with(pool, *options, data, dst),
            Host::Pinned(p) => stream.upload(p, dst),
            Host::Registered(r) => stream.upload(r, dst),
        }
    }

    /// Enqueues a download into all of it through the safe layer (a pageable or staged one returns when done).
    fn download(&mut self, stream: &Stream, src: &DeviceView<'_, u8>) -> cuda_pinned::Result<()> {
        match self {
            Host::Pageable(v) => stream.download_pageable(src, v),
            Host::Staged {
                data,
                pool,
                options: None,
            } => stream.download_staged(pool, src, data),
            Host::Staged {
                data,
                pool,
                options: Some(options),
            } => stream.download_staged_with(pool, *options, src, data),
            Host::Pinned(p) => stream.download(src, p),
            Host::Registered(r) => stream.download(src, r),
        }
    }

    /// The address of the page-locked memory for a raw copy that writes it (after waiting for device work).
    fn raw_ptr(&mut self) -> Outcome<*mut c_void> {
        match self {
            Host::Pageable(_) | Host::Staged { .. } => {
                Err("a raw asynchronous copy needs page-locked memory".into())
            }
            Host::Pinned(p) => Ok(p.as_mut_slice()?.as_mut_ptr().cast()),
            Host::Registered(r) => Ok(r.as_mut_slice()?.as_mut_ptr().cast()),
        }
    }
}

/// The estimated seconds of one bandwidth figure, for the progress bar.
pub fn estimate(method: Method, bytes: usize, plan: &Plan) -> f64 {
    let speed = match method {
        Method::Pageable => 8e9,
        // Downloads are slower than uploads; this is about the slower.
        Method::Staged | Method::StagedChunked => 12e9,
        _ => 45e9,
    };
    estimate_at(speed, bytes, plan)
}

/// The estimated seconds of one bandwidth figure of copies at about `speed` bytes per second.
pub fn estimate_at(speed: f64, bytes: usize, plan: &Plan) -> f64 {
    let copies = (plan.min_samples + 2) as f64 * bytes as f64 / speed;
    // Filling and checking the data runs at a few GB/s on the host.
    plan.min_seconds.max(copies) + 0.002 + 3.0 * bytes as f64 / 4e9
}

/// The bytes of staging buffers one staged transfer of `bytes` with `options` takes from its pool at most, as
/// the library reports them (`StagingOptions::staging_buffers`: two per worker thread, one per chunk at most,
/// none below the crossover to the driver's path); none for options the library refuses.
pub fn staging_bytes(options: StagingOptions, bytes: usize) -> usize {
    let (buffers, each) = options.staging_buffers(bytes).unwrap_or((0, 0));
    buffers * each
}

/// The estimated seconds of warming a staging pool for transfers of up to `bytes` with `options`
/// ([`warm_pool`]), and of measuring once per process which way of pinning is faster (`Pinning::Auto`: four
/// pins of 32 MiB).
pub fn estimate_warm(options: StagingOptions, bytes: usize) -> f64 {
    0.05 + 2.0 * staging_bytes(options, bytes) as f64 * 0.5 / f64::from(1u32 << 30)
}

/// The estimated seconds of [`bandwidth`].
pub fn estimate_all(plan: &Plan) -> f64 {
    let mut total = 0.0;
    for method in Method::MEASURED {
        if method.against_pageable() {
            let options = method.staging_options().unwrap_or_default();
            total += estimate_warm(options, plan.max_size());
        }
    }
    for method in Method::MEASURED {
        let apis = if method.has_raw() { 2.0 } else { 1.0 };
        for &bytes in &plan.sizes {
            total += 2.0 * apis * estimate(method, bytes, plan);
        }
    }
    total
}

/// Every method, size, direction and API of the plan.
pub fn bandwidth(bench: &mut Bench) -> Outcome<Vec<Bandwidth>> {
    let plan = bench.plan.clone();
    let stream = bench.stream.clone();
    let mut device = DeviceBuffer::<u8>::uninit(&stream, plan.max_size())?;
    let mut check = vec![0u8; plan.max_size()];
    let watch = Stopwatch::new(&stream)?;
    let mut rows = Vec::new();
    // Size by size, every method in turn, so that the figures a ratio compares (staged against the driver's
    // pageable path above all) are measured seconds apart, not minutes; and the ordinary memory of the
    // pageable and staged methods is one `Vec` per size, so that they copy from and into the same pages.
    for &bytes in &plan.sizes {
        let mut ordinary = Some(vec![0u8; bytes]);
        for method in Method::MEASURED {
            let apis: &[Api] = if method.has_raw() {
                &[Api::Safe, Api::Raw]
            } else {
                &[Api::Safe]
            };
            if method.against_pageable() {
                // The library adapts the chunk size to the transfer, so each size has staging buffers of its own
                // size: pin them before its figures.
                let options = method.staging_options().unwrap_or_default();
                bench.progress.show("warming the staging pool");
                warm_pool(&bench.pool, options, bytes)?;
                // Blocks the pool evicted to make room are unpinned on the crate's release thread: done now, not
                // during the figures.
                bench.context.synchronize()?;
                if bytes == plan.max_size() {
                    bench.progress.advance(estimate_warm(options, bytes));
                }
            }
            let mut host = match (method, ordinary.take()) {
                (Method::Pageable, Some(data)) => Host::Pageable(data),
                (Method::Staged | Method::StagedChunked, Some(data)) => Host::Staged {
                    data,
                    pool: bench.pool.clone(),
                    options: method.staging_options(),
                },
                (_, data) => {
                    ordinary = data;
                    Host::new(&bench.context, &bench.pool, method, bytes)?
                }
            };
            for direction in Direction::BOTH {
                for &api in apis {
                    bench.progress.show(&format!(
                        "{} {} {} {}",
                        method.label(),
                        api.key(),
                        direction.key(),
                        size_label(bytes)
                    ));
                    let seed = bench.next_seed();
                    let figure = Figure {
                        stream: &stream,
                        watch: &watch,
                        plan: &plan,
                        bytes,
                        seed,
                    };
                    let measured =
                        figure.measure(direction, api, &mut host, &mut device, &mut check);
                    let (timed, verified) = match measured {
                        Ok(m) => m,
                        Err(e) => {
                            // A raw copy is not tracked: the host memory may only go once the stream is idle,
                            // and if that cannot be known it must never go.
                            if stream.synchronize().is_err() {
                                std::mem::forget(host);
                            }
                            return Err(e);
                        }
                    };
                    rows.push(Bandwidth {
                        method,
                        api,
                        direction,
                        bytes,
                        seconds: timed.seconds,
                        samples: timed.samples,
                        batch: timed.batch,
                        verified,
                    });
                    bench.progress.advance(estimate(method, bytes, &plan));
                }
            }
            match host {
                // Ordinary memory: the next method of this size copies through the same pages.
                Host::Pageable(data) | Host::Staged { data, .. } => ordinary = Some(data),
                host => {
                    // Pinned memory is unpinned on the crate's release thread once the device is idle, and
                    // unpinning holds back every other thread's driver calls: done here, between figures, not
                    // during the next.
                    drop(host);
                    bench.context.synchronize()?;
                }
            }
        }
    }
    // In the order the report and the document list them: method by method, size by size.
    let place = |m: Method| Method::MEASURED.iter().position(|&x| x == m);
    rows.sort_by_key(|r| (place(r.method), r.bytes));
    Ok(rows)
}

/// Rounds of [`staged_turns`] per size and direction.
pub fn turn_rounds(plan: &Plan) -> usize {
    // The driver's pageable path against itself (below the crossover the staged path is that path) read
    // 0.90-1.04x over 9 rounds on 2 x H200: the median needs more rounds than that to be within a few percent.
    if plan.quick { 21 } else { 31 }
}

/// How many times the plan's batch time a batch of [`staged_turns`] lasts.
const TURN_BATCHES: f64 = 10.0;

/// The estimated seconds of [`staged_turns`].
pub fn estimate_turns(plan: &Plan) -> f64 {
    let options = StagingOptions::default();
    plan.sizes
        .iter()
        .map(|&bytes| {
            let batch = (TURN_BATCHES * plan.batch_seconds).max(bytes as f64 / 8e9);
            estimate_warm(options, bytes) + 2.0 * (turn_rounds(plan) as f64 + 2.0) * 2.0 * batch
        })
        .sum()
}

/// The crate's staged path (default options) against the driver's pageable path, size by size and in each
/// direction, in turns through one `Vec`: per round a batch of each, which goes first alternating round by
/// round; a batch is as many copies as the plan's batch time holds, one pageable copy timed to set it (see
/// [`StagedTurns`]). Both paths' data was checked by the bandwidth figures; these only time them.
pub fn staged_turns(bench: &mut Bench) -> Outcome<Vec<StagedTurns>> {
    let plan = bench.plan.clone();
    let stream = bench.stream.clone();
    let pool = bench.pool.clone();
    let watch = Stopwatch::new(&stream)?;
    let mut device = DeviceBuffer::<u8>::uninit(&stream, plan.max_size())?;
    let rounds = turn_rounds(&plan);
    let turn_plan = Plan {
        batch_seconds: TURN_BATCHES * plan.batch_seconds,
        ..plan.clone()
    };
    let mut rows = Vec::new();
    for &bytes in &plan.sizes {
        bench.progress.show("warming the staging pool");
        warm_pool(&pool, StagingOptions::default(), bytes)?;
        bench.context.synchronize()?;
        let mut data = vec![0u8; bytes];
        fill_pattern(&mut data, bench.next_seed());
        for direction in Direction::BOTH {
            bench.progress.show(&format!(
                "staged against pageable in turns, {} {}",
                direction.key(),
                size_label(bytes)
            ));
            let mut turn = Turn {
                stream: &stream,
                pool: &pool,
                direction,
                data: &mut data,
                device: &mut device,
            };
            turn.copy(false)?;
            turn.copy(true)?;
            // Batches ten times the plan's: a round's ratio is then steadier than a figure's single batch.
            let once = watch.time(|| turn.copy(false))?;
            let (batch, _) = batching(&turn_plan, once);
            let mut ratios = Vec::with_capacity(rounds);
            for round in 0..rounds {
                let mut batch_of =
                    |staged: bool| watch.time(|| (0..batch).try_for_each(|_| turn.copy(staged)));
                let (pageable, staged) = if round % 2 == 0 {
                    let pageable = batch_of(false)?;
                    (pageable, batch_of(true)?)
                } else {
                    let staged = batch_of(true)?;
                    (batch_of(false)?, staged)
                };
                ratios.push(pageable / staged);
            }
            rows.push(StagedTurns {
                direction,
                bytes,
                batch,
                rounds,
                ratio: Extra::spread(ratios),
            });
        }
    }
    bench.progress.advance(estimate_turns(&plan));
    Ok(rows)
}

/// One size and direction of [`staged_turns`]: its copies, through the driver's pageable path or staged.
struct Turn<'a> {
    stream: &'a Stream,
    pool: &'a PinnedPool,
    direction: Direction,
    data: &'a mut Vec<u8>,
    device: &'a mut DeviceBuffer<u8>,
}

impl Turn<'_> {
    /// One copy of the whole `Vec` (each returns once its data is where it goes, or staged on the device).
    fn copy(&mut self, staged: bool) -> Outcome<()> {
        let bytes = self.data.len();
        let (stream, pool) = (self.stream, self.pool);
        match (self.direction, staged) {
            (Direction::Upload, false) => {
                stream.upload_pageable(self.data, &mut self.device.slice_mut(..bytes)?)?;
            }
            (Direction::Upload, true) => {
                stream.upload_staged(pool, self.data, &mut self.device.slice_mut(..bytes)?)?;
            }
            (Direction::Download, false) => {
                stream.download_pageable(&self.device.slice(..bytes)?, self.data)?;
            }
            (Direction::Download, true) => {
                stream.download_staged(pool, &self.device.slice(..bytes)?, self.data)?;
            }
        }
        Ok(())
    }
}

/// Pins the staging buffers that two staged transfers of `bytes` with `options` may hold at once (or as
/// many as `pool` has room for) and gives them back to the pool, so that no timed copy pins: a transfer's last
/// buffers may still be in flight, so not yet reusable, when the next transfer takes its own. The first pin of
/// a `Pinning::Auto` pool also measures which way of pinning is faster.
///
/// # Errors
/// The pool's or the driver's, other than the pool being full.
pub fn warm_pool(pool: &PinnedPool, options: StagingOptions, bytes: usize) -> Outcome<()> {
    let (buffers, each) = options.staging_buffers(bytes)?;
    let wanted = 2 * buffers;
    let mut held = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        match pool.try_alloc::<u8>(each) {
            Ok(buffer) => held.push(buffer),
            Err(Error::PoolExhausted { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One figure being measured: where, how long, and the seed of its data.
pub struct Figure<'a> {
    /// The stream the copies run on.
    pub stream: &'a Stream,
    /// Events on that stream.
    pub watch: &'a Stopwatch,
    /// How long to measure.
    pub plan: &'a Plan,
    /// Bytes per copy.
    pub bytes: usize,
    /// The seed of the data pattern.
    pub seed: u64,
}

impl Figure<'_> {
    /// Times copies of `direction` between `host` and the start of `device` through `api`, then checks what
    /// arrived (through `check`, as long as the largest copy): the median and whether the data arrived intact.
    /// After an error, device work with `host` may still be in flight.
    pub fn measure(
        &self,
        direction: Direction,
        api: Api,
        host: &mut Host,
        device: &mut DeviceBuffer<u8>,
        check: &mut [u8],
    ) -> Outcome<(Timed, bool)> {
        match direction {
            Direction::Upload => self.upload(api, host, device, check),
            Direction::Download => self.download(api, host, device, check),
        }
    }

    /// Times uploads of `host` into the start of `device`, then checks what arrived through `check`.
    fn upload(
        &self,
        api: Api,
        host: &mut Host,
        device: &mut DeviceBuffer<u8>,
        check: &mut [u8],
    ) -> Outcome<(Timed, bool)> {
        let (stream, bytes) = (self.stream, self.bytes);
        fill_pattern(host.write()?, self.seed);
        let mut dst = device.slice_mut(..bytes)?;
        let timed = match api {
            Api::Safe => self
                .watch
                .copies(self.plan, || Ok(host.upload(stream, &mut dst)?))?,
            Api::Raw => {
                let (src, d) = (host.raw_ptr()?.cast_const(), dst.as_raw());
                self.watch.copies(self.plan, || {
                    // SAFETY: `src` is `bytes` bytes of page-locked memory owned by `host` and `d` the first
                    // `bytes` bytes of `device`, both alive until the stream is idle: `copies` waits for its
                    // last batch, and on an error `bandwidth` synchronises the stream or leaks the host memory.
                    // Nothing else touches either meanwhile, and later work on `device` runs on this stream.
                    unsafe { driver_call!(cuMemcpyHtoDAsync_v2(d, src, bytes, stream.as_raw())) }?;
                    Ok(())
                })?
            }
        };
        let check = &mut check[..bytes];
        stream.download_pageable(&device.slice(..bytes)?, check)?;
        Ok((timed, pattern_mismatch(check, self.seed).is_none()))
    }

    /// Times downloads of the start of `device` into `host`, then checks what arrived.
    fn download(
        &self,
        api: Api,
        host: &mut Host,
        device: &mut DeviceBuffer<u8>,
        check: &mut [u8],
    ) -> Outcome<(Timed, bool)> {
        let (stream, bytes) = (self.stream, self.bytes);
        fill_pattern(host.write()?, self.seed);
        host.upload(stream, &mut device.slice_mut(..bytes)?)?;
        host.write()?.fill(POISON);
        let src = device.slice(..bytes)?;
        let timed = match api {
            Api::Safe => self
                .watch
                .copies(self.plan, || Ok(host.download(stream, &src)?))?,
            Api::Raw => {
                let (dst, s) = (host.raw_ptr()?, src.as_raw());
                self.watch.copies(self.plan, || {
                    // SAFETY: as in `upload`, the other way round: `dst` is `bytes` bytes of page-locked memory
                    // of `host`, which the host does not touch until the stream is idle.
                    unsafe { driver_call!(cuMemcpyDtoHAsync_v2(dst, s, bytes, stream.as_raw())) }?;
                    Ok(())
                })?
            }
        };
        stream.synchronize()?;
        let verified = if host.readable() {
            pattern_mismatch(host.read()?, self.seed).is_none()
        } else {
            // Reading write-combined memory with the CPU crawls: send it back up and check it from there.
            host.upload(stream, &mut device.slice_mut(..bytes)?)?;
            let check = &mut check[..bytes];
            stream.download_pageable(&device.slice(..bytes)?, check)?;
            pattern_mismatch(check, self.seed).is_none()
        };
        Ok((timed, verified))
    }
}

/// The estimated seconds of [`bidirectional`], for the progress bar.
pub fn estimate_bidirectional(plan: &Plan) -> f64 {
    let copies = (3 * plan.bidirectional_samples + 8) as f64;
    plan.bidirectional_sizes
        .iter()
        .map(|&b| 0.05 + b as f64 * (copies / 45e9 + 6.0 / 4e9))
        .sum()
}

/// An upload on one stream and a download on another at the same time, from and to pinned memory, and each
/// alone with the same buffers, per size of the plan. `under_load` is called once while both directions run
/// (to read the PCIe link when it is busy).
pub fn bidirectional(
    bench: &mut Bench,
    under_load: &mut dyn FnMut(),
) -> Outcome<Vec<Bidirectional>> {
    let plan = bench.plan.clone();
    let Some(max) = plan.bidirectional_sizes.iter().copied().max() else {
        return Ok(Vec::new());
    };
    let context = bench.context.clone();
    let pair = Pair {
        up: Stream::new(&context)?,
        down: Stream::new(&context)?,
        start: Event::new(&context)?,
        end: Event::new(&context)?,
        down_done: Event::without_timing(&context)?,
    };
    let (up, down) = (&pair.up, &pair.down);
    let mut src = Pinned::<u8>::zeroed(&context, max)?;
    let mut dst = Pinned::<u8>::zeroed(&context, max)?;
    let mut to_device = DeviceBuffer::<u8>::uninit(up, max)?;
    let mut from_device = DeviceBuffer::<u8>::uninit(down, max)?;
    let (watch_up, watch_down) = (Stopwatch::new(up)?, Stopwatch::new(down)?);
    let mut rows = Vec::new();
    let mut read_link = Some(under_load);
    for &bytes in &plan.bidirectional_sizes {
        bench
            .progress
            .show(&format!("both directions at once, {}", size_label(bytes)));
        let (seed_up, seed_down) = (bench.next_seed(), bench.next_seed());
        fill_pattern(&mut src.as_mut_slice()?[..bytes], seed_up);
        fill_pattern(&mut dst.as_mut_slice()?[..bytes], seed_down);
        down.upload(&dst.slice(..bytes)?, &mut from_device.slice_mut(..bytes)?)?;
        dst.as_mut_slice()?[..bytes].fill(POISON);

        let samples = plan.bidirectional_samples;
        let (mut both, mut alone_up, mut alone_down) = (Vec::new(), Vec::new(), Vec::new());
        {
            let (s, mut d) = (src.slice(..bytes)?, dst.slice_mut(..bytes)?);
            let (mut to, from) = (to_device.slice_mut(..bytes)?, from_device.slice(..bytes)?);
            // Warm-up, long enough to bring the link to its working speed and read it there.
            for _ in 0..4 {
                pair.enqueue(&s, &mut to, &from, &mut d)?;
            }
            if let Some(read) = read_link.take() {
                read();
            }
            pair.end.synchronize()?;
            for _ in 0..samples {
                pair.enqueue(&s, &mut to, &from, &mut d)?;
                pair.end.synchronize()?;
                both.push(pair.end.elapsed_since(&pair.start)?.as_secs_f64());
                alone_up.push(watch_up.time(|| Ok(up.upload(&s, &mut to)?))?);
                alone_down.push(watch_down.time(|| Ok(down.download(&from, &mut d)?))?);
            }
        }
        let mut check = vec![0u8; bytes];
        up.download_pageable(&to_device.slice(..bytes)?, &mut check)?;
        let verified = pattern_mismatch(&check, seed_up).is_none()
            && pattern_mismatch(&dst.as_slice()?[..bytes], seed_down).is_none();
        rows.push(Bidirectional {
            bytes,
            both_seconds: median(both),
            upload_seconds: median(alone_up),
            download_seconds: median(alone_down),
            samples,
            verified,
        });
        bench.progress.advance(estimate_bidirectional(&Plan {
            bidirectional_sizes: vec![bytes],
            ..plan.clone()
        }));
    }
    Ok(rows)
}

/// Two streams and the events that time an upload on one and a download on the other, started together.
struct Pair {
    up: Stream,
    down: Stream,
    start: Event,
    end: Event,
    down_done: Event,
}

impl Pair {
    /// Enqueues both copies between `start` and `end` (on `up`; `down` waits for `start`, and `up` for the end
    /// of `down`'s copy before `end`). Returns at once.
    fn enqueue(
        &self,
        src: &cuda_pinned::PinnedView<'_, u8>,
        to: &mut DeviceViewMut<'_, u8>,
        from: &DeviceView<'_, u8>,
        dst: &mut cuda_pinned::PinnedViewMut<'_, u8>,
    ) -> Outcome<()> {
        self.start.record(&self.up)?;
        self.down.wait(&self.start)?;
        self.up.upload(src, to)?;
        self.down.download(from, dst)?;
        self.down_done.record(&self.down)?;
        self.up.wait(&self.down_done)?;
        self.end.record(&self.up)?;
        Ok(())
    }
}
