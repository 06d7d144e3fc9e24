//! `--staging-sweep`: staged uploads and downloads of 256 MiB for every chunk size and thread count of a small
//! grid, beside the driver's pageable path at the same size, so that `StagingOptions::default()` can be tuned
//! by measurement.
//!
//! A point's chunk size is the options' `chunk_bytes`, the most a chunk may be: where 256 MiB would give a
//! thread fewer than two chunks of that size, the library cuts smaller ones, as for any user passing those
//! options. 256 MiB is above the crossover to the driver's path, so every point is staged.
//!
//! The sweep has a pool of its own, with room for two transfers' buffers at every point of the grid, so that
//! the figures measure the options and not a budget; it is trimmed when the size of the staging buffers changes
//! and warmed before each point, so that pinning is never timed.

use cuda_pinned::staging::StagingOptions;
use cuda_pinned::{DeviceBuffer, PinnedPool, Pinning, WhenFull};

use crate::bandwidth::{self, Figure, Host, staging_bytes, warm_pool};
use crate::results::{Api, Bandwidth, Direction, Method, StagingSweep, SweepPoint, size_label};
use crate::timing::{Plan, Stopwatch};
use crate::{Bench, Outcome};

const MIB: usize = 1 << 20;
/// Bytes per transfer.
pub const BYTES: usize = 256 * MIB;
/// `StagingOptions::chunk_bytes` of the grid.
pub const CHUNKS: [usize; 5] = [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB];
/// `StagingOptions::threads` of the grid.
pub const THREADS: [usize; 5] = [1, 2, 4, 8, 16];

/// The grid's options, chunk size outer.
fn grid() -> impl Iterator<Item = StagingOptions> {
    CHUNKS.into_iter().flat_map(|chunk_bytes| {
        THREADS.into_iter().map(move |threads| {
            StagingOptions::default()
                .chunk_bytes(chunk_bytes)
                .threads(threads)
        })
    })
}

/// The sweep pool's budget: two transfers' staging buffers at the point that needs the most.
pub fn pool_budget() -> usize {
    grid()
        .map(|options| 2 * staging_bytes(options, BYTES))
        .max()
        .unwrap_or(0)
}

/// The estimated seconds of one staged figure of the sweep: a guess of a few GB/s per thread, up to what the
/// link and the host's memory allow.
fn estimate_point(options: StagingOptions, plan: &Plan) -> f64 {
    let speed = (options.threads as f64 * 4e9).min(20e9);
    bandwidth::estimate_at(speed, BYTES, plan)
}

/// The estimated seconds of [`sweep`], for the progress bar.
pub fn estimate(plan: &Plan) -> f64 {
    let figures = grid()
        .map(|options| 2.0 * estimate_point(options, plan))
        .sum::<f64>()
        + 2.0 * bandwidth::estimate(Method::Pageable, BYTES, plan);
    // The pool is trimmed when the chunk size changes: each chunk size pins for its largest thread count.
    let warm: f64 = CHUNKS
        .into_iter()
        .map(|chunk_bytes| {
            let threads = THREADS.into_iter().max().unwrap_or(1);
            bandwidth::estimate_warm(
                StagingOptions::default()
                    .chunk_bytes(chunk_bytes)
                    .threads(threads),
                BYTES,
            )
        })
        .sum();
    figures + warm
}

/// What every figure of the sweep measures with.
struct Rig {
    watch: Stopwatch,
    device: DeviceBuffer<u8>,
    check: Vec<u8>,
}

impl Rig {
    /// One figure of `host` through the safe layer, then `estimate` seconds of progress.
    fn figure(
        &mut self,
        bench: &mut Bench,
        host: &mut Host,
        method: Method,
        direction: Direction,
        estimate: f64,
    ) -> Outcome<Bandwidth> {
        let seed = bench.next_seed();
        let figure = Figure {
            stream: &bench.stream,
            watch: &self.watch,
            plan: &bench.plan,
            bytes: BYTES,
            seed,
        };
        let (timed, verified) = figure.measure(
            direction,
            Api::Safe,
            host,
            &mut self.device,
            &mut self.check,
        )?;
        bench.progress.advance(estimate);
        Ok(Bandwidth {
            method,
            api: Api::Safe,
            direction,
            bytes: BYTES,
            seconds: timed.seconds,
            samples: timed.samples,
            batch: timed.batch,
            verified,
        })
    }
}

/// The driver's pageable path at [`BYTES`] each way, then every point of the grid each way.
pub fn sweep(bench: &mut Bench) -> Outcome<StagingSweep> {
    let stream = bench.stream.clone();
    let budget = pool_budget();
    let pool = PinnedPool::builder(&bench.context, budget)
        .pinning(Pinning::Auto)
        .when_full(WhenFull::Wait)
        .build();
    let mut rig = Rig {
        watch: Stopwatch::new(&stream)?,
        device: DeviceBuffer::<u8>::uninit(&stream, BYTES)?,
        check: vec![0u8; BYTES],
    };

    let mut pageable = Vec::new();
    let mut host = Host::new(&bench.context, &pool, Method::Pageable, BYTES)?;
    for direction in Direction::BOTH {
        bench.progress.show(&format!(
            "staging sweep: pageable {} {}",
            direction.key(),
            size_label(BYTES)
        ));
        let estimate = bandwidth::estimate(Method::Pageable, BYTES, &bench.plan);
        pageable.push(rig.figure(bench, &mut host, Method::Pageable, direction, estimate)?);
    }
    drop(host);

    let mut points = Vec::new();
    let mut host = Host::staged(&pool, None, BYTES);
    let mut buffer_bytes = None;
    for options in grid() {
        let (_, each) = options.staging_buffers(BYTES)?;
        if buffer_bytes != Some(each) {
            // Blocks of the last buffer size are no use now: give their memory back before pinning new ones (the
            // unpinning happens on the crate's release thread, done by the synchronization).
            pool.trim()?;
            pool.context().synchronize()?;
            buffer_bytes = Some(each);
        }
        bench.progress.show(&format!(
            "staging sweep: pinning {} chunks for {} threads",
            size_label(options.chunk_bytes),
            options.threads
        ));
        warm_pool(&pool, options, BYTES)?;
        if let Host::Staged { options: o, .. } = &mut host {
            *o = Some(options);
        }
        for direction in Direction::BOTH {
            bench.progress.show(&format!(
                "staging sweep: {} {}, {} threads",
                direction.key(),
                size_label(options.chunk_bytes),
                options.threads
            ));
            let estimate = estimate_point(options, &bench.plan);
            let figure = rig.figure(bench, &mut host, Method::Staged, direction, estimate)?;
            points.push(SweepPoint {
                chunk_bytes: options.chunk_bytes,
                threads: options.threads,
                figure,
            });
        }
        if options.threads == THREADS[THREADS.len() - 1] {
            bench
                .progress
                .advance(bandwidth::estimate_warm(options, BYTES));
        }
    }
    drop(host);
    stream.synchronize()?;
    pool.trim()?;
    let default = StagingOptions::default();
    Ok(StagingSweep {
        bytes: BYTES,
        pool_budget: budget,
        default_chunk_bytes: default.chunk_bytes,
        default_threads: default.threads,
        pageable,
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_every_chunk_size_by_every_thread_count() {
        let grid: Vec<StagingOptions> = grid().collect();
        assert_eq!(grid.len(), CHUNKS.len() * THREADS.len());
        assert_eq!(grid[0].chunk_bytes, 2 * MIB);
        assert_eq!(grid[0].threads, 1);
        assert_eq!(grid[1].chunk_bytes, 2 * MIB);
        assert_eq!(grid[1].threads, 2);
        assert!(grid.iter().all(|o| o.chunk_bytes > 0 && o.threads > 0));
    }

    #[test]
    fn the_pool_holds_two_transfers_at_every_point() {
        // 16 MiB x 8 threads: 16 buffers of 16 MiB; 32 MiB x 8 threads: cut to 16 MiB chunks (two per thread),
        // so 16 buffers of 16 MiB too.
        assert_eq!(pool_budget(), 2 * 256 * MIB);
        for options in grid() {
            assert!(2 * staging_bytes(options, BYTES) <= pool_budget());
        }
    }
}
