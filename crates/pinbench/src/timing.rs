//! How pinbench times device work: CUDA events around batches of copies, after warm-up, repeated until the
//! figure is stable, reduced to the median. Also the data pattern every source is filled with and checked
//! against.

use cuda_pinned::{Event, Stream};

use crate::Outcome;

/// How much to measure: the full run or `--quick`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Whether this is the `--quick` plan.
    pub quick: bool,
    /// Transfer sizes of the bandwidth tables, ascending.
    pub sizes: Vec<usize>,
    /// Timed device time to collect per figure, in seconds (the batches repeat until they add up to it).
    pub min_seconds: f64,
    /// At least this many timed batches per figure.
    pub min_samples: usize,
    /// At most this many timed batches per figure.
    pub max_samples: usize,
    /// Small copies are batched until a batch lasts about this long, in seconds.
    pub batch_seconds: f64,
    /// At most this many copies per batch: few enough that the driver's queue never fills and blocks.
    pub max_batch: usize,
    /// Sizes of the both-directions-at-once figure.
    pub bidirectional_sizes: Vec<usize>,
    /// Repetitions of the both-directions figure.
    pub bidirectional_samples: usize,
    /// Size of the large (per GiB) allocation and registration figures.
    pub alloc_bytes: usize,
    /// Repetitions of each large allocation.
    pub alloc_samples: usize,
    /// Repetitions of the 1 MiB per-call allocation.
    pub per_call_samples: usize,
    /// Timed batches of the warm pool allocation (each of `costs::POOL_WARM_BATCH` calls).
    pub pool_warm_samples: usize,
    /// Batches of the enqueue-overhead figures of copies.
    pub enqueue_samples: usize,
    /// Batches of the kernel-launch figures, each way: a batch takes about 2 ms, and a median of many is what
    /// tells differences of a tenth of a microsecond per launch apart from the host's jitter.
    pub launch_samples: usize,
    /// Chunks of the overlap pipeline.
    pub overlap_chunks: usize,
    /// Bytes per chunk of the overlap pipeline.
    pub overlap_chunk_bytes: usize,
    /// Repetitions of each overlap pipeline.
    pub overlap_samples: usize,
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

impl Plan {
    /// Sizes 4 KiB to 1 GiB (powers of 4), at least 100 ms or 5 batches each: long enough that a disturbance of
    /// a few tens of milliseconds (seen on a VM's H100) cannot move the median.
    pub fn full() -> Plan {
        Plan {
            quick: false,
            sizes: sizes(4 * KIB, GIB),
            min_seconds: 0.100,
            min_samples: 5,
            max_samples: 200,
            batch_seconds: 0.002,
            max_batch: 256,
            bidirectional_sizes: vec![256 * MIB, GIB],
            bidirectional_samples: 5,
            alloc_bytes: GIB,
            alloc_samples: 3,
            per_call_samples: 20,
            pool_warm_samples: 25,
            enqueue_samples: 10,
            launch_samples: 100,
            // 64 chunks: the first copy, which no kernel can overlap, is 1/64 of the pipeline.
            overlap_chunks: 64,
            overlap_chunk_bytes: 4 * MIB,
            overlap_samples: 5,
        }
    }

    /// Sizes up to 64 MiB, at least 15 ms or 5 batches each, no 1 GiB anywhere: under 20 seconds.
    pub fn quick() -> Plan {
        Plan {
            quick: true,
            sizes: sizes(4 * KIB, 64 * MIB),
            min_seconds: 0.015,
            min_samples: 5,
            max_samples: 50,
            batch_seconds: 0.0005,
            max_batch: 256,
            bidirectional_sizes: vec![256 * MIB],
            bidirectional_samples: 3,
            alloc_bytes: 256 * MIB,
            alloc_samples: 1,
            per_call_samples: 10,
            pool_warm_samples: 11,
            enqueue_samples: 5,
            launch_samples: 40,
            overlap_chunks: 8,
            overlap_chunk_bytes: 16 * MIB,
            overlap_samples: 3,
        }
    }

    /// The largest transfer of the bandwidth tables.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// `from`, `4 * from`, ... up to `to`.
fn sizes(from: usize, to: usize) -> Vec<usize> {
    std::iter::successors(Some(from), |&s| s.checked_mul(4))
        .take_while(|&s| s <= to)
        .collect()
}

/// One figure's timing: the median device time of one copy and how it was reached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// Median seconds per copy.
    pub seconds: f64,
    /// Timed batches.
    pub samples: usize,
    /// Copies per batch.
    pub batch: usize,
}

/// A pair of timing events on one stream.
pub struct Stopwatch {
    stream: Stream,
    start: Event,
    end: Event,
}

impl Stopwatch {
    /// Events for timing work on `stream`.
    pub fn new(stream: &Stream) -> Outcome<Stopwatch> {
        Ok(Stopwatch {
            stream: stream.clone(),
            start: Event::new(stream.context())?,
            end: Event::new(stream.context())?,
        })
    }

    /// The stream it times.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device time of the work `enqueue` puts on the stream (waiting for it to complete).
    pub fn time(&self, enqueue: impl FnOnce() -> Outcome<()>) -> Outcome<f64> {
        self.start.record(&self.stream)?;
        enqueue()?;
        self.end.record(&self.stream)?;
        self.end.synchronize()?;
        Ok(self.end.elapsed_since(&self.start)?.as_secs_f64())
    }

    /// Times `copy` (one copy enqueued on the stream per call) as [`Plan`] says: one warm-up copy, one
    /// calibration copy that sets the batch size, then timed batches until enough device time has passed,
    /// reduced to the median time per copy.
    pub fn copies(&self, plan: &Plan, mut copy: impl FnMut() -> Outcome<()>) -> Outcome<Timed> {
        copy()?;
        let once = self.time(&mut copy)?;
        let (batch, samples) = batching(plan, once);
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let took = self.time(|| (0..batch).try_for_each(|_| copy()))?;
            times.push(took / batch as f64);
        }
        Ok(Timed {
            seconds: median(times),
            samples,
            batch,
        })
    }
}

/// Copies per batch and batches for a copy that took `once` seconds: batches of about `plan.batch_seconds`,
/// and enough of them for `plan.min_seconds` of timed work, within the plan's bounds.
pub fn batching(plan: &Plan, once: f64) -> (usize, usize) {
    // The small subtraction keeps 0.002 / 0.001 at 2 (not the 3 that rounding error would make of it).
    let up = |x: f64| (x - 1e-9).ceil().max(0.0) as usize;
    let once = once.max(1e-7);
    let batch = up(plan.batch_seconds / once).clamp(1, plan.max_batch);
    let samples = up(plan.min_seconds / (once * batch as f64))
        .clamp(plan.min_samples, plan.max_samples.max(plan.min_samples));
    (batch, samples)
}

/// The median (the upper one of an even count); NaN for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The word at index `i` of the pattern for `seed`: distinct, non-zero-looking data, so a copy that moved
/// nothing, moved stale data or misplaced it shows (the `SplitMix64` finaliser of `seed + i`).
fn pattern_word(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern for `seed`. Writes only, in order (fine for write-combined memory).
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    let mut i = 0;
    for chunk in &mut chunks {
        chunk.copy_from_slice(&pattern_word(seed, i).to_le_bytes());
        i += 1;
    }
    let tail = chunks.into_remainder();
    let word = pattern_word(seed, i).to_le_bytes();
    tail.copy_from_slice(&word[..tail.len()]);
}

/// The first byte of `buf` that differs from the pattern for `seed`, or `None` if all match.
pub fn pattern_mismatch(buf: &[u8], seed: u64) -> Option<usize> {
    let mut chunks = buf.chunks_exact(8);
    let mut i = 0u64;
    let mut wrong = None;
    for chunk in &mut chunks {
        let word = pattern_word(seed, i).to_le_bytes();
        if chunk != word {
            wrong = Some((i, word));
            break;
        }
        i += 1;
    }
    let (i, word, chunk) = match wrong {
        Some((i, word)) => (i, word, &buf[i as usize * 8..i as usize * 8 + 8]),
        None => (i, pattern_word(seed, i).to_le_bytes(), chunks.remainder()),
    };
    let at = chunk.iter().zip(word).position(|(a, b)| *a != b)?;
    Some(i as usize * 8 + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_four() {
        let full = Plan::full();
        assert_eq!(full.sizes.len(), 10);
        assert_eq!(full.sizes[0], 4096);
        assert_eq!(full.max_size(), 1 << 30);
        let quick = Plan::quick();
        assert_eq!(quick.max_size(), 64 << 20);
        assert!(quick.bidirectional_sizes.iter().all(|&s| s < 1 << 30));
        assert!(quick.alloc_bytes < 1 << 30);
    }

    #[test]
    fn small_copies_are_batched_and_large_ones_repeated() {
        let plan = Plan::full();
        // 2 us copies: batches capped at max_batch, enough of them for 100 ms, within max_samples.
        let (batch, samples) = batching(&plan, 2e-6);
        assert_eq!(batch, 256);
        assert_eq!(samples, (0.100f64 / (2e-6 * 256.0)).ceil() as usize);
        assert!(samples <= plan.max_samples);
        // A 50 ms copy: one per batch, the minimum count.
        assert_eq!(batching(&plan, 0.050), (1, 5));
        // A 1 ms copy: two per batch, fifty batches.
        assert_eq!(batching(&plan, 0.001), (2, 50));
        // Nonsense input stays within bounds.
        let (b, s) = batching(&plan, 0.0);
        assert!(b <= plan.max_batch && s <= plan.max_samples);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn patterns_differ_by_seed_and_find_the_first_wrong_byte() {
        for len in [0, 1, 7, 8, 9, 4096, 4099] {
            let mut a = vec![0u8; len];
            fill_pattern(&mut a, 1);
            assert_eq!(pattern_mismatch(&a, 1), None, "len {len}");
            if len >= 8 {
                assert_ne!(pattern_mismatch(&a, 2), None);
                assert!(a.iter().any(|&b| b != 0));
                a[len - 1] ^= 0x10;
                assert_eq!(pattern_mismatch(&a, 1), Some(len - 1));
            }
        }
        let mut zeros = vec![0u8; 64];
        assert_eq!(pattern_mismatch(&zeros, 5), Some(0));
        fill_pattern(&mut zeros, 5);
        assert_eq!(pattern_mismatch(&zeros, 5), None);
    }
}
