//! Gathering rows of a page-locked host table into device memory on the device ([`Gatherer`]): against a CPU
//! model for row sizes from 1 byte to 64 KiB (every access width of the kernels), sorted and not, with
//! duplicate indices; the errors before anything is enqueued; and the table in the tracking: host writes wait
//! for a gather in flight (beside a control that writes around the tracker and is seen by the gather), and a
//! table dropped under a gather is unpinned only after it.
//!
//! On a GPU (feature `gpu`) the crate's PTX kernels run; on the simulated driver, its stand-ins of them.

mod common;

use common::{data, refused, serial, spin};
use cuda_pinned::{
    Context, DeviceBuffer, Event, GatherEngine, GatherOptions, Gatherer, Pinned, PinnedBuilder,
    ReadOrder, Registered, Stream,
};

fn context() -> Context {
    common::device(0)
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    data(len.div_ceil(4), seed)
        .into_iter()
        .flat_map(u32::to_le_bytes)
        .take(len)
        .collect()
}

/// The rows of `table` (rows of `row` elements) at `indices`, one after another: what a gather must produce.
fn model<T: Copy>(table: &[T], row: usize, indices: &[u32]) -> Vec<T> {
    indices
        .iter()
        .flat_map(|&i| &table[i as usize * row..][..row])
        .copied()
        .collect()
}

/// `count` indices into `rows` rows, with duplicates (every fifth repeats the one before).
fn indices(count: usize, rows: usize, seed: u64) -> Vec<u32> {
    let mut out: Vec<u32> = data(count, seed)
        .into_iter()
        .map(|x| x % rows as u32)
        .collect();
    for k in (5..count).step_by(5) {
        out[k] = out[k - 1];
    }
    out
}

/// Gathers `count` random rows of `row` bytes from a registered table of `rows` rows with `options` and
/// returns what arrived and what should have.
fn gather_once(
    row: usize,
    rows: usize,
    count: usize,
    options: GatherOptions,
) -> (Vec<u8>, Vec<u8>) {
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let gatherer = Gatherer::new(&ctx).unwrap();
    let values = bytes(row * rows, row as u64);
    let table = Registered::new(&ctx, values.clone()).unwrap();
    let picks = indices(count, rows, (row * 31 + count) as u64);
    let mut out = DeviceBuffer::<u8>::zeroed(&stream, row * count).unwrap();
    gatherer
        .gather(&stream, &table, row, &picks, &mut out, options)
        .unwrap();
    let mut got = Pinned::<u8>::zeroed(&ctx, row * count).unwrap();
    stream.download(&out, &mut got).unwrap();
    (
        got.as_slice().unwrap().to_vec(),
        model(&values, row, &picks),
    )
}

#[test]
fn gathered_rows_match_the_model_at_every_row_size() {
    let _serial = serial();
    // Each access width of the kernels (16, 8, 4, 2, 1 bytes), odd sizes, rows up to 64 KiB, and a batch of one.
    for (row, rows, count) in [
        (1, 1000, 777),
        (64, 1000, 1),
        (2, 500, 300),
        (3, 400, 257),
        (6, 300, 200),
        (12, 300, 200),
        (24, 200, 150),
        (48, 200, 150),
        (64, 1000, 500),
        (100, 100, 80),
        (1024, 64, 100),
        (4100, 16, 20),
        (65536, 8, 12),
    ] {
        let kernel = GatherOptions::default().engine(GatherEngine::Kernel);
        let copies = GatherOptions::default().engine(GatherEngine::Copies);
        for options in [
            kernel.order(ReadOrder::Batch),
            kernel.order(ReadOrder::Sorted),
            copies,
            GatherOptions::default(),
        ] {
            let (got, want) = gather_once(row, rows, count, options);
            assert!(
                got == want,
                "rows of {row} bytes, {options:?}: the gather differs from the model"
            );
        }
    }
}

#[test]
fn sorted_reads_of_a_large_table_keep_the_batch_order() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let gatherer = Gatherer::new(&ctx).unwrap();
    // 640 MiB of 64-byte rows, each word its own index, and a batch dense enough for 64 KiB buckets: 10240 of
    // them, three tiles of the device's scan (the last one partly empty), so that every tile's slots start after
    // the tiles before it. Duplicates, and the table's first and last rows.
    let (row, rows, count) = (16usize, 10 << 20, 200_000usize);
    let table = Registered::new(&ctx, (0..(row * rows) as u32).collect::<Vec<u32>>()).unwrap();
    let mut picks = indices(count, rows, 11);
    picks[0] = (rows - 1) as u32;
    picks[count - 1] = 0;
    let mut out = DeviceBuffer::<u32>::zeroed(&stream, row * count).unwrap();
    let mut got = Pinned::<u32>::zeroed(&ctx, row * count).unwrap();
    for order in [ReadOrder::Sorted, ReadOrder::Batch] {
        let options = GatherOptions::default()
            .engine(GatherEngine::Kernel)
            .order(order);
        gatherer
            .gather(&stream, &table, row, &picks, &mut out, options)
            .unwrap();
        stream.download(&out, &mut got).unwrap();
        let got = got.as_slice().unwrap();
        for (k, &pick) in picks.iter().enumerate() {
            let first = pick * row as u32;
            assert!(
                (0..row).all(|w| got[k * row + w] == first + w as u32),
                "{order:?}: output row {k} is not table row {pick}"
            );
        }
    }
}

#[test]
fn a_gather_from_views_into_views_touches_only_them() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let gatherer = Gatherer::new(&ctx).unwrap();
    let (row, rows) = (16usize, 64usize);
    let values: Vec<u32> = data(row * rows, 7);
    let table = PinnedBuilder::new(&ctx)
        .device_mapped(true)
        .from_slice(&values)
        .unwrap();
    // Rows 8.. of the table, gathered into the middle of a larger buffer.
    let view = table.slice(8 * row..).unwrap();
    let picks = [3u32, 0, 55, 3, 20];
    let mut out = DeviceBuffer::<u32>::zeroed(&stream, row * 9).unwrap();
    let mut middle = out.slice_mut(row * 2..row * 7).unwrap();
    gatherer
        .gather(
            &stream,
            &view,
            row,
            &picks,
            &mut middle,
            GatherOptions::default(),
        )
        .unwrap();
    let mut got = Pinned::<u32>::zeroed(&ctx, row * 9).unwrap();
    stream.download(&out, &mut got).unwrap();
    let mut want = vec![0u32; row * 2];
    for &p in &picks {
        want.extend_from_slice(&values[(8 + p as usize) * row..][..row]);
    }
    want.extend(vec![0u32; row * 2]);
    assert_eq!(got.as_slice().unwrap(), &want[..]);
}

#[test]
fn bad_gathers_are_errors_before_anything_is_enqueued() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let gatherer = Gatherer::new(&ctx).unwrap();
    let table = Registered::new(&ctx, bytes(10 * 8, 1)).unwrap();
    let mut out = DeviceBuffer::<u8>::zeroed(&stream, 3 * 8).unwrap();
    let options = GatherOptions::default();
    refused(
        gatherer.gather(&stream, &table, 8, &[0, 10, 1], &mut out, options),
        "gathering row 10 (index 1 of the batch) of a table of 10 rows",
    );
    refused(
        gatherer.gather(&stream, &table, 8, &[0, 1], &mut out, options),
        "gathering 2 rows of 8 elements into 24 elements",
    );
    refused(
        gatherer.gather(&stream, &table, 0, &[], &mut out, options),
        "rows of 0 elements",
    );
    // A row length that leaves part of a row over is wrong, even where every index fits: 80 bytes are not rows
    // of 7 (this gather once copied rows 0, 1 and 2 of 7 bytes without a word).
    let mut out7 = DeviceBuffer::<u8>::zeroed(&stream, 3 * 7).unwrap();
    refused(
        gatherer.gather(&stream, &table, 7, &[0, 1, 2], &mut out7, options),
        "a table of 80 elements is not made of rows of 7 elements (3 left over)",
    );
    let pinned_table = Pinned::from_slice(&ctx, &bytes(10 * 8, 1)).unwrap();
    refused(
        cuda_pinned::RowTable::new(Gatherer::new(&ctx).unwrap(), pinned_table, 7, options)
            .map(drop),
        "a table of 80 elements is not made of rows of 7 elements",
    );
    // Meant as a prefix of whole rows, it is a view of them.
    let prefix = table.slice(..77).unwrap();
    gatherer
        .gather(&stream, &prefix, 7, &[0, 10, 2], &mut out7, options)
        .unwrap();
    let mut got7 = Pinned::<u8>::zeroed(&ctx, 3 * 7).unwrap();
    stream.download(&out7, &mut got7).unwrap();
    let all = bytes(10 * 8, 1);
    assert_eq!(got7.as_slice().unwrap(), model(&all[..77], 7, &[0, 10, 2]));
    // Nothing was written: the buffer still holds its zeros.
    let mut got = Pinned::<u8>::zeroed(&ctx, 3 * 8).unwrap();
    stream.download(&out, &mut got).unwrap();
    assert!(got.as_slice().unwrap().iter().all(|&b| b == 0));
    // An empty batch into an empty buffer is nothing to do.
    let mut empty = DeviceBuffer::<u8>::zeroed(&stream, 0).unwrap();
    gatherer
        .gather(&stream, &table, 8, &[], &mut empty, options)
        .unwrap();
    stream.synchronize().unwrap();
}

/// A gather queued behind 300 ms of other work on its stream, then a host write of the whole table: through
/// `as_mut_slice` (which waits for the gather) or, for the control, through the raw pointer (which does not).
/// Returns what was gathered, the rows the table held before the write, and whether the gather's call returned
/// only once the work queued before it had run (as under compute-sanitizer's memcheck, which serializes the
/// batched copy), when no write can land under it.
fn host_write_during_a_gather(
    through_the_tracker: bool,
    engine: GatherEngine,
) -> (Vec<u8>, Vec<u8>, bool) {
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let gatherer = Gatherer::new(&ctx).unwrap();
    let (row, rows) = (64usize, 256usize);
    let values = bytes(row * rows, 9);
    let mut table = PinnedBuilder::new(&ctx)
        .device_mapped(true)
        .from_slice(&values)
        .unwrap();
    let picks = indices(128, rows, 5);
    let mut out = DeviceBuffer::<u8>::zeroed(&stream, row * picks.len()).unwrap();
    stream.synchronize().unwrap();
    spin(&stream, 300);
    let spun = Event::without_timing(&ctx).unwrap();
    stream.record(&spun).unwrap();
    gatherer
        .gather(
            &stream,
            &table,
            row,
            &picks,
            &mut out,
            GatherOptions::default().engine(engine),
        )
        .unwrap();
    let serialized = spun.query().unwrap();
    if through_the_tracker {
        table.as_mut_slice().unwrap().fill(0xEE);
    } else {
        // SAFETY: the table's `row * rows` bytes of live page-locked memory; the gather may read them at the
        // same time, which is what this control shows.
        unsafe { std::ptr::write_bytes(table.as_ptr().cast_mut(), 0xEE, row * rows) };
    }
    let mut got = Pinned::<u8>::zeroed(&ctx, out.len()).unwrap();
    stream.download(&out, &mut got).unwrap();
    (
        got.as_slice().unwrap().to_vec(),
        model(&values, row, &picks),
        serialized,
    )
}

#[test]
fn host_writes_to_the_table_wait_for_a_gather_in_flight() {
    let _serial = serial();
    for engine in [GatherEngine::Kernel, GatherEngine::Copies] {
        let (got, want, _) = host_write_during_a_gather(true, engine);
        assert!(
            got == want,
            "{engine:?}: the host wrote the table under the gather"
        );
    }
}

#[test]
fn control_a_write_around_the_tracker_lands_under_the_gather() {
    let _serial = serial();
    for engine in [GatherEngine::Kernel, GatherEngine::Copies] {
        let (got, want, serialized) = host_write_during_a_gather(false, engine);
        // The kernel's launch never waits; the batched copy's call may, under a sanitizer only.
        if serialized && engine == GatherEngine::Copies {
            println!(
                "{engine:?}: the gather's call waited for the work before it; no write can land under it"
            );
            continue;
        }
        assert!(
            got != want,
            "{engine:?}: a write around the tracker did not reach the gather: this control cannot show the rule"
        );
    }
}

#[test]
fn a_table_dropped_under_a_gather_is_unpinned_after_it() {
    let _serial = serial();
    for engine in [GatherEngine::Kernel, GatherEngine::Copies] {
        table_dropped_under_a_gather(engine);
    }
}

fn table_dropped_under_a_gather(engine: GatherEngine) {
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let gatherer = Gatherer::new(&ctx).unwrap();
    let (row, rows) = (256usize, 512usize);
    let values = bytes(row * rows, 11);
    let picks = indices(400, rows, 12);
    let mut out = DeviceBuffer::<u8>::zeroed(&stream, row * picks.len()).unwrap();
    stream.synchronize().unwrap();
    {
        let table = Registered::new(&ctx, values.clone()).unwrap();
        spin(&stream, 300);
        gatherer
            .gather(
                &stream,
                &table,
                row,
                &picks,
                &mut out,
                GatherOptions::default()
                    .engine(engine)
                    .order(ReadOrder::Sorted),
            )
            .unwrap();
    }
    // Memory the allocator hands out now would be the table's if it had been freed: fill it with other bytes.
    let others: Vec<Vec<u8>> = (0..16).map(|_| vec![0xAB; row * rows]).collect();
    let mut got = Pinned::<u8>::zeroed(&ctx, out.len()).unwrap();
    stream.download(&out, &mut got).unwrap();
    drop(others);
    assert!(
        got.as_slice().unwrap() == model(&values, row, &picks),
        "{engine:?}: the gather read the table after it was freed"
    );
}

/// Set in the child processes of [`a_process_that_ends_right_after_dropping_a_gatherer_exits_cleanly`].
const ENDING_CHILD: &str = "CUDA_PINNED_TEST_ENDING_CHILD";

/// A program that drops a `Gatherer` and a registered table as `main` returns: their releases run on the crate's
/// release thread while the process exits. With the CUDA runtime linked statically (feature `gpu`), a driver
/// call still running there while the runtime tore itself down crashed the process: on an H100, 5 of 12 such
/// processes ended in a segmentation fault before the exit hook of `memory/release.rs`, 0 of 12 after. Each child
/// is this test binary running only this test.
#[test]
fn a_process_that_ends_right_after_dropping_a_gatherer_exits_cleanly() {
    if std::env::var_os(ENDING_CHILD).is_some() {
        let _serial = serial();
        let ctx = context();
        drop(Gatherer::new(&ctx).unwrap());
        drop(Registered::new(&ctx, vec![1u8; 1 << 20]).unwrap());
        return;
    }
    let _serial = serial();
    let mut failed = Vec::new();
    for run in 0..8 {
        let child = run_child(
            "a_process_that_ends_right_after_dropping_a_gatherer_exits_cleanly",
            ENDING_CHILD,
        );
        match child {
            Some((true, stdout)) if stdout.contains("1 passed") => {}
            other => failed.push(format!("child {run}: {other:?}")),
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Runs this test binary's test `name` alone in a child process with `variable` set, and returns whether it
/// exited successfully and what it printed; `None` if it had not ended after 30 s (it is killed then).
fn run_child(name: &str, variable: &str) -> Option<(bool, String)> {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(variable, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    Some((output.status.success(), stdout))
}

/// The indices of batch `i` of [`prefetched`]: `count` rows of a table of `rows`, a function of `i`.
fn batch_indices(i: usize, count: usize, rows: usize) -> Vec<u32> {
    (0..count)
        .map(|k| ((i * 7919 + k * 104_729) % rows) as u32)
        .collect()
}

/// What a prefetcher delivered: per batch, its index and its rows as downloaded, or the error's text.
type Delivered = Vec<(usize, Result<Vec<u32>, String>)>;

/// A prefetcher of `batches` gathered batches of `count` rows of 16 `u32` from a registered table, whose fill
/// closure writes `batch_indices`, except for batch `bad` (if any), which gets an index past the table. Returns,
/// per batch delivered, its index and either its rows as downloaded or the error's text; and the table's
/// values.
fn prefetched(
    batches: usize,
    count: usize,
    bad: Option<usize>,
    engine: GatherEngine,
) -> (Delivered, Vec<u32>) {
    use cuda_pinned::prefetch::GatherBatch;
    use cuda_pinned::{PinnedPool, Prefetcher, RowTable};
    let ctx = context();
    let compute = Stream::new(&ctx).unwrap();
    let (row, rows) = (16usize, 500usize);
    let values = data(row * rows, 21);
    let table = Registered::new(&ctx, values.clone()).unwrap();
    let source = RowTable::new(
        Gatherer::new(&ctx).unwrap(),
        table,
        row,
        GatherOptions::default().engine(engine),
    )
    .unwrap();
    let unused = PinnedPool::new(&ctx, 0);
    let prefetcher = Prefetcher::<GatherBatch<u32, Registered<u32>>>::builder(
        &unused,
        &compute,
        (source, count),
    )
    .batches(batches)
    .workers(2)
    .build(move |i, batch| {
        batch.indices.clear();
        batch.indices.extend(batch_indices(i, count, rows));
        if Some(i) == bad {
            batch.indices[count / 2] = rows as u32;
        }
        Ok(())
    })
    .unwrap();
    let mut got = Vec::new();
    for batch in prefetcher {
        match batch {
            Ok(batch) => {
                let mut host = Pinned::<u32>::zeroed(&ctx, row * count).unwrap();
                compute.download(&*batch, &mut host).unwrap();
                got.push((batch.index(), Ok(host.as_slice().unwrap().to_vec())));
            }
            Err(e) => got.push((got.len(), Err(e.to_string()))),
        }
    }
    (got, values)
}

#[test]
fn a_prefetcher_feeds_batches_gathered_on_the_device_in_order() {
    let _serial = serial();
    for engine in [GatherEngine::Kernel, GatherEngine::Copies] {
        let (got, values) = prefetched(12, 64, None, engine);
        assert_eq!(got.len(), 12, "{engine:?}");
        for (position, (index, rows)) in got.into_iter().enumerate() {
            assert_eq!(index, position, "{engine:?}: batches out of order");
            let want: Vec<u32> = batch_indices(index, 64, 500)
                .iter()
                .flat_map(|&r| values[r as usize * 16..][..16].to_vec())
                .collect();
            assert!(
                rows.unwrap() == want,
                "{engine:?}: batch {index} differs from its rows"
            );
        }
    }
}

#[test]
fn an_index_past_the_table_is_the_error_of_its_batch_in_place() {
    let _serial = serial();
    let (got, _) = prefetched(10, 32, Some(4), GatherEngine::Kernel);
    // Batches 0..4 arrive, then batch 4's error; the stream ends after it.
    assert_eq!(
        got.len(),
        5,
        "{:?}",
        got.iter().map(|(i, r)| (i, r.is_ok())).collect::<Vec<_>>()
    );
    for (index, rows) in &got[..4] {
        assert!(rows.is_ok(), "batch {index}: {rows:?}");
    }
    let error = got[4].1.as_ref().unwrap_err();
    assert!(
        error.contains("gathering row 500 (index 16 of the batch) of a table of 500 rows"),
        "{error}"
    );
}

/// Set in the child process of [`a_users_exit_hook_may_synchronize_after_the_crates`].
const HOOKED_CHILD: &str = "CUDA_PINNED_TEST_HOOKED_CHILD";

unsafe extern "C" {
    fn atexit(hook: extern "C" fn()) -> std::ffi::c_int;
}

/// A user's exit hook (registered before the crate's, so it runs after it) that synchronizes a context.
extern "C" fn synchronize_at_exit() {
    match Context::on(0).and_then(|c| c.synchronize()) {
        Ok(()) => println!("exit hook synchronized"),
        Err(e) => println!("exit hook failed: {e}"),
    }
}

/// A program (a C host's static destructors, say) may still call the crate from an exit hook that runs after the
/// crate's own: `Context::synchronize` there waited for a round of the release thread that, stopped by the
/// crate's hook, never came, and the process never ended. The child runs only this test; it must end, and its
/// hook must get an answer: done, or, where the driver's own exit handler has run first (a real driver's
/// registers when it initializes, after this hook), the driver's error that it is shutting down.
#[test]
fn a_users_exit_hook_may_synchronize_after_the_crates() {
    if std::env::var_os(HOOKED_CHILD).is_some() {
        // SAFETY: registering a plain function of this file.
        unsafe { atexit(synchronize_at_exit) };
        let _serial = serial();
        let ctx = context();
        // Starts the release thread, whose start registers the crate's hook.
        drop(Registered::new(&ctx, vec![1u8; 1 << 20]).unwrap());
        ctx.synchronize().unwrap();
        return;
    }
    let _serial = serial();
    let child = run_child(
        "a_users_exit_hook_may_synchronize_after_the_crates",
        HOOKED_CHILD,
    );
    let Some((success, stdout)) = child else {
        panic!("the child's exit hung for 30 s");
    };
    assert!(success, "the child failed:\n{stdout}");
    assert!(
        stdout.contains("exit hook synchronized")
            || stdout.contains("exit hook failed") && stdout.contains("DEINITIALIZED"),
        "{stdout}"
    );
}

/// Gathers on a held stream fill the gatherer's staging, and a gather on another, idle stream then finds no
/// room: it must pin a buffer of its own rather than wait for the held stream's gathers (unrelated work) to
/// complete, and it must complete on the device while they are held. On the simulated driver the held stream
/// runs only once released, after the checks.
#[test]
fn a_gather_does_not_wait_for_the_staging_of_gathers_on_another_stream() {
    let _serial = serial();
    let ctx = context();
    let (held, idle) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    // Room for 2 Ki indices: two gathers of 1 Ki rows fill it.
    let gatherer = Gatherer::with_staging(&ctx, 8 << 10).unwrap();
    let (row, rows) = (4usize, 4096usize);
    let values = data(row * rows, 31);
    let table = Registered::new(&ctx, values.clone()).unwrap();
    let picks = indices(1024, rows, 32);
    let sorted = GatherOptions::default().order(ReadOrder::Sorted);
    let mut outs: Vec<DeviceBuffer<u32>> = (0..3)
        .map(|_| DeviceBuffer::zeroed(&idle, row * picks.len()).unwrap())
        .collect();
    idle.synchronize().unwrap();
    let hold = common::hold(&held, std::time::Duration::from_secs(2));
    for out in &mut outs[..2] {
        gatherer
            .gather(&held, &table, row, &picks, out, sorted)
            .unwrap();
    }
    let started = std::time::Instant::now();
    gatherer
        .gather(&idle, &table, row, &picks, &mut outs[2], sorted)
        .unwrap();
    let took = started.elapsed();
    // Nor does it wait on the device: its indices are sorted on the gatherer's stream, after the held gathers'
    // sorts, which wait for nothing.
    let gathered = Event::without_timing(&ctx).unwrap();
    idle.record(&gathered).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !gathered.query().unwrap() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let done_while_held = gathered.query().unwrap();
    let mut got = Pinned::<u32>::zeroed(&ctx, row * picks.len()).unwrap();
    idle.download(&outs[2], &mut got).unwrap();
    let rows_arrived = got.as_slice().unwrap() == model(&values, row, &picks);
    drop(hold);
    held.synchronize().unwrap();
    assert!(
        took < std::time::Duration::from_secs(1),
        "the gather on the idle stream waited {took:?} for the held stream's gathers"
    );
    assert!(
        done_while_held,
        "the gather on the idle stream waited on the device for the held stream's gathers"
    );
    assert!(rows_arrived, "the gather on the idle stream is wrong");
}

/// Looking up the gatherer's kernels asks the driver only what it can answer: no call fails, so compute-sanitizer
/// has no API error to report (each kernel's parameter count is read from its PTX, and only those parameters are
/// asked for). The control: the same kernel looked up in a module loaded from a binary image, whose parameters
/// are counted by asking until the driver says there is no such parameter, a failed call.
#[cfg(not(feature = "gpu"))]
#[test]
fn looking_up_the_gather_kernels_makes_no_call_fail() {
    let _serial = serial();
    let sim = common::sim().expect("the simulated driver");
    let ctx = context();
    let before = sim.api_errors().len();
    let gatherer = Gatherer::new(&ctx).unwrap();
    assert_eq!(sim.api_errors()[before..], [] as [String; 0]);
    drop(gatherer);

    // SAFETY: the simulated driver takes any image for a module and reads none of it.
    let binary = unsafe { cuda_pinned::Module::load_binary(&ctx, b"\x7fELF not read") }.unwrap();
    let kernel = binary.kernel("cuda_pinned_gather_4").unwrap();
    assert_eq!(kernel.param_sizes(), Some(&[8; 6][..]));
    let failed = sim.api_errors()[before..].to_vec();
    assert_eq!(failed, ["cuFuncGetParamInfo: CUDA_ERROR_INVALID_VALUE"]);
}
