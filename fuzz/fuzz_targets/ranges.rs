//! The range and chunk arithmetic, with extreme lengths and offsets: the range check of a view
//! (`DeviceBuffer::slice`, `Pinned::slice` and the `_mut` forms, `src/memory/view.rs`), the length check of a
//! staged transfer, and how a staged transfer of the view splits into chunks and workers (`src/staging/options.rs`).
//! Nothing may panic or overflow; a range not within the buffer, lengths that differ and a chunk size or thread
//! count of zero are `Error::InvalidArgument`s with a message that names them; a view's byte offsets stay within
//! its buffer; the plan's chunk size is the one asked for or a smaller power of two that gives each worker at
//! most two chunks; the chunks cover the transfer exactly, in order, with no gap or overlap, each of at most
//! the plan's chunk size and all but the last of exactly it, and aligned to elements where that size is a
//! multiple of the element size (where it is not, chunks split elements, which the byte copies allow); the
//! slices a download cuts with `chunks_mut` are the same chunks; the workers are as many as asked but never more
//! than `MAX_THREADS` or the chunks, and each chunk belongs to exactly one worker, each worker's in increasing
//! order; the staging buffers a transfer takes are at most two per worker and one per chunk, each at most a
//! chunk.
//!
//! Input layout (a short input reads as zeros):
//!
//! | bytes   | meaning                                                                                      |
//! |---------|----------------------------------------------------------------------------------------------|
//! | 0       | the element size: `1 + byte % 64`                                                            |
//! | 1       | the range's bounds: bits 0-1 the start (0 or 3 included, 1 excluded, 2 unbounded), bits 2-3  |
//! |         | the end (0 or 3 excluded, 1 included, 2 unbounded)                                           |
//! | numbers | the buffer's length in elements (near: the most elements of this size that fit in `usize`),  |
//! |         | the range's start and end (near: the length), the host length of the transfer (near: the    |
//! |         | view's length), the chunk size in bytes (near: the element size), the threads (near: the     |
//! |         | chunks)                                                                                      |
//! | 8 bytes | where to sample chunks when there are too many to check all (`u64` little-endian)            |
//!
//! A number is a tag byte `t` (form `t % 8`, `k = t >> 3`, 0 to 31) and the bytes its form reads:
//!
//! | form | value                                                            | more bytes        |
//! |------|------------------------------------------------------------------|-------------------|
//! | 0    | `k`                                                              | none              |
//! | 1    | near: `near + k - 16` (wrapping)                                 | none              |
//! | 2    | `usize::MAX - k`                                                 | none              |
//! | 3    | `2^(b % 64) + k - 16` (wrapping)                                 | one, `b`          |
//! | 4    | `near * k` (wrapping)                                            | none              |
//! | 5    | the byte                                                         | one               |
//! | 6    | the `u16`, little-endian                                         | two               |
//! | 7    | the `u64`, little-endian                                         | eight             |

#![no_main]

use std::ops::{Bound, Range};

use cuda_pinned::Error;
use cuda_pinned::fuzzing::ranges::{StagingPlan, check_lengths, staging_plan, view_bounds};
use cuda_pinned::staging::{MAX_THREADS, StagingOptions};
use cuda_pinned_fuzz::Reader;
use libfuzzer_sys::fuzz_target;

/// Up to this many chunks, every chunk and every worker is checked; above, a sample.
const CHECK_ALL: usize = 4096;

/// Transfers up to this many bytes are also cut with `chunks`, as a download cuts the user's slice.
const CUT: usize = 1 << 16;

static ZEROS: [u8; CUT] = [0; CUT];

/// A number in the encoding of the module docs; `near` is what forms 1 and 4 are relative to.
fn number(input: &mut Reader<'_>, near: usize) -> usize {
    let t = input.byte();
    let k = usize::from(t >> 3);
    match t % 8 {
        0 => k,
        1 => near.wrapping_add(k).wrapping_sub(16),
        2 => usize::MAX - k,
        3 => (1usize << (input.byte() % 64))
            .wrapping_add(k)
            .wrapping_sub(16),
        4 => near.wrapping_mul(k),
        5 => usize::from(input.byte()),
        6 => usize::from(u16::from_le_bytes(input.bytes())),
        _ => input.u64_le() as usize,
    }
}

/// The start bound that bits 0-1 of `bits` pick: included (0 or 3), excluded (1) or unbounded (2).
fn start_bound(bits: u8, value: usize) -> Bound<usize> {
    match bits & 3 {
        1 => Bound::Excluded(value),
        2 => Bound::Unbounded,
        _ => Bound::Included(value),
    }
}

/// The end bound that bits 0-1 of `bits` pick: excluded (0 or 3), included (1) or unbounded (2).
fn end_bound(bits: u8, value: usize) -> Bound<usize> {
    match bits & 3 {
        1 => Bound::Included(value),
        2 => Bound::Unbounded,
        _ => Bound::Excluded(value),
    }
}

/// The message of an invalid-argument error; panics on any other error.
fn invalid(error: Error) -> String {
    match error {
        Error::InvalidArgument { message, .. } => message,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

/// What the range check must say: the elements, or `None` for a range not within `len`.
fn expected_bounds(start: Bound<usize>, end: Bound<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match start {
        Bound::Included(s) => Some(s),
        Bound::Excluded(s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    }?;
    let end = match end {
        Bound::Included(e) => e.checked_add(1),
        Bound::Excluded(e) => Some(e),
        Bound::Unbounded => Some(len),
    }?;
    (start <= end && end <= len).then_some((start, end))
}

/// Chunk `index` of `plan` against the arithmetic: it starts at `index * chunk_bytes`, holds `chunk_bytes`
/// (the last what is left), and is aligned to elements of `size` where the chunk size is.
fn check_chunk(plan: &StagingPlan, index: usize, size: usize) -> Range<usize> {
    let chunk = plan.chunk(index);
    let start = index
        .checked_mul(plan.chunk_bytes())
        .expect("a chunk below the count starts below the total");
    assert_eq!(chunk.start, start, "chunk {index} of {plan:?}");
    let last = index + 1 == plan.chunks();
    let len = if last {
        plan.total() - start
    } else {
        plan.chunk_bytes()
    };
    assert_eq!(chunk.len(), len, "chunk {index} of {plan:?}");
    assert!(
        !chunk.is_empty() && chunk.len() <= plan.chunk_bytes(),
        "chunk {index} of {plan:?}"
    );
    if plan.chunk_bytes().is_multiple_of(size) && plan.total().is_multiple_of(size) {
        assert!(
            chunk.start.is_multiple_of(size) && chunk.len().is_multiple_of(size),
            "chunk {index} of {plan:?} splits elements of {size} bytes"
        );
    }
    assert!(plan.worker_of(index) < plan.workers());
    chunk
}

/// Every invariant of a staging plan of `total` bytes with `options` (chunk size and threads above zero).
fn check_plan(plan: &StagingPlan, total: usize, options: StagingOptions, size: usize, sample: u64) {
    let StagingOptions {
        chunk_bytes,
        threads,
        ..
    } = options;
    let threads = threads.min(MAX_THREADS);
    assert_eq!(plan.total(), total);
    assert!(
        plan.chunk_bytes() > 0 && plan.chunk_bytes() <= chunk_bytes,
        "{plan:?} of {options:?}"
    );
    if plan.chunk_bytes() < chunk_bytes {
        assert!(
            plan.chunk_bytes().is_power_of_two() && plan.chunks() <= 2 * threads,
            "{plan:?} of {options:?}"
        );
    }
    assert_eq!(
        plan.chunks(),
        total.div_ceil(plan.chunk_bytes()),
        "{plan:?}"
    );
    assert_eq!(plan.workers(), threads.min(plan.chunks()), "{plan:?}");
    assert_eq!(plan.workers() == 0, total == 0, "{plan:?}");
    let (chunks, workers) = (plan.chunks(), plan.workers());

    if chunks <= CHECK_ALL {
        // Every chunk: in order, from 0 to the total, with no gap or overlap.
        let mut end = 0;
        for index in 0..chunks {
            let chunk = check_chunk(plan, index, size);
            assert_eq!(
                chunk.start, end,
                "gap or overlap before chunk {index} of {plan:?}"
            );
            end = chunk.end;
        }
        assert_eq!(end, total, "the chunks of {plan:?} do not reach the end");
        // Every worker has chunks, in increasing order, and every chunk has exactly one worker.
        let mut owner = vec![None; chunks];
        for worker in 0..workers {
            let mine: Vec<usize> = plan.chunks_of(worker).collect();
            assert!(!mine.is_empty(), "worker {worker} of {plan:?} has no chunk");
            assert!(mine.is_sorted(), "worker {worker} of {plan:?}: {mine:?}");
            for index in mine {
                assert!(
                    index < chunks,
                    "worker {worker} of {plan:?} has chunk {index}"
                );
                assert_eq!(plan.worker_of(index), worker, "chunk {index} of {plan:?}");
                let was = owner[index].replace(worker);
                assert_eq!(was, None, "chunk {index} of {plan:?} has two workers");
            }
        }
        assert!(
            owner.iter().all(Option::is_some),
            "a chunk of {plan:?} has no worker"
        );
    } else {
        // Too many to walk: the first and last chunks, a sampled one, and their neighbours.
        let sampled = (sample % chunks as u64) as usize;
        for index in [0, 1, sampled, chunks / 2, chunks - 2, chunks - 1] {
            let chunk = check_chunk(plan, index, size);
            if index + 1 < chunks {
                assert_eq!(
                    plan.chunk(index + 1).start,
                    chunk.end,
                    "after chunk {index} of {plan:?}"
                );
            } else {
                assert_eq!(
                    chunk.end, total,
                    "the chunks of {plan:?} do not reach the end"
                );
            }
            let worker = plan.worker_of(index);
            assert_eq!(worker, index % workers, "chunk {index} of {plan:?}");
        }
        for worker in [0, sampled % workers, workers - 1] {
            let first: Vec<usize> = plan.chunks_of(worker).take(3).collect();
            let expected: Vec<usize> = (0..3)
                .map_while(|n| workers.checked_mul(n)?.checked_add(worker))
                .filter(|&index| index < chunks)
                .collect();
            assert_eq!(first, expected, "worker {worker} of {plan:?}");
        }
    }
    // Past the end: nothing, and no panic.
    for index in [chunks, chunks.saturating_add(1), usize::MAX] {
        assert_eq!(plan.chunk(index), total..total, "chunk {index} of {plan:?}");
        let _ = plan.worker_of(index);
    }
    for worker in [workers, usize::MAX] {
        assert_eq!(
            plan.chunks_of(worker).next(),
            None,
            "worker {worker} of {plan:?}"
        );
    }
    // The chunks a download cuts the user's slice into are the same.
    if total <= CUT {
        let base = ZEROS.as_ptr() as usize;
        for (index, part) in ZEROS[..total].chunks(plan.chunk_bytes()).enumerate() {
            let at = part.as_ptr() as usize - base;
            assert_eq!(
                plan.chunk(index),
                at..at + part.len(),
                "chunk {index} of {plan:?}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Reader::new(data);
    let size = 1 + usize::from(input.byte() % 64);
    let bounds = input.byte();
    let len = number(&mut input, usize::MAX / size);
    let start = start_bound(bounds, number(&mut input, len));
    let end = end_bound(bounds >> 2, number(&mut input, len));

    // The view: exactly the model's elements, or an error that names the range and the length.
    let view = view_bounds(start, end, len);
    match (&view, expected_bounds(start, end, len)) {
        (Ok(got), Some(expected)) => assert_eq!(*got, expected, "{start:?}..{end:?} of {len}"),
        (Err(_), None) => {}
        (got, expected) => panic!("{start:?}..{end:?} of {len}: {got:?}, expected {expected:?}"),
    }
    let (first, last) = match view {
        Ok(elements) => elements,
        Err(e) => {
            let message = invalid(e);
            assert!(
                message.contains(&format!("{start:?}..{end:?}"))
                    && message.contains(&format!("not within a buffer of {len} elements")),
                "{message}"
            );
            // Transfer the whole buffer instead.
            (0, len)
        }
    };
    let elements = last - first;

    // A buffer exists only if its bytes fit in `usize` (`byte_len` refuses the rest). Then a view's byte
    // offsets, which `address_of` and the staged copies compute unchecked, fit too and stay within it.
    let buffer_bytes = len.checked_mul(size);
    if let Some(buffer_bytes) = buffer_bytes {
        let offset = first.checked_mul(size).expect("a view's offset overflows");
        let bytes = elements.checked_mul(size).expect("a view's bytes overflow");
        assert!(
            offset
                .checked_add(bytes)
                .is_some_and(|end| end <= buffer_bytes)
        );
    }

    // The staged transfer of the view: lengths first, then the split.
    let host = number(&mut input, elements);
    match check_lengths("staged upload", host, elements) {
        Ok(()) => assert_eq!(host, elements),
        Err(e) => {
            let message = invalid(e);
            assert!(host != elements, "{message}");
            assert!(
                message.starts_with("staged upload: ")
                    && message.contains(&format!(
                        "{host} elements and the device memory {elements};"
                    )),
                "{message}"
            );
        }
    }
    let chunk_bytes = number(&mut input, size);
    let total = elements.checked_mul(size);
    let chunks = total.map_or(0, |total| total.checked_div(chunk_bytes).unwrap_or(0));
    let threads = number(&mut input, chunks);
    let sample = input.u64_le();
    // Every size staged: the crossover to the driver's path decides nothing about the split.
    let options = StagingOptions::default()
        .chunk_bytes(chunk_bytes)
        .threads(threads)
        .chunked_from(0);
    // A host slice of more than `usize::MAX` bytes cannot exist; the split is still checked up to that.
    let Some(total) = total else { return };
    match staging_plan(total, options) {
        Ok(plan) => {
            assert!(chunk_bytes > 0 && threads > 0);
            check_plan(&plan, total, options, size, sample);
            let (buffers, each) = options
                .staging_buffers(total)
                .expect("the options made a plan");
            assert!(
                buffers <= 2 * plan.workers()
                    && buffers <= plan.chunks()
                    && each <= plan.chunk_bytes()
                    && each <= total
                    && (buffers == 0) == (total == 0),
                "{buffers} buffers of {each} bytes for {plan:?}"
            );
        }
        Err(e) => {
            let message = invalid(e);
            assert!(chunk_bytes == 0 || threads == 0, "{message}");
            assert!(
                message.contains(&format!("not {chunk_bytes} bytes and {threads} threads")),
                "{message}"
            );
        }
    }
});
