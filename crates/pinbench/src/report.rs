//! The readable report: the header, then one table per direction of GB/s per size and method (safe-layer
//! figures with their ratio to the raw driver call on the same memory, staged ones with their ratio to the
//! driver's pageable path), then the other sections.

use std::fmt::Write;

use crate::costs;
use crate::results::{Api, Direction, Extra, Method, Report, StagingSweep, size_label};

/// The whole report as text.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    header(&mut out, report);
    for direction in Direction::BOTH {
        bandwidth(&mut out, report, direction);
    }
    staged_turns(&mut out, report);
    if let Some(sweep) = &report.staging_sweep {
        staging_sweep(&mut out, sweep);
    }
    bidirectional(&mut out, report);
    allocation(&mut out, report);
    enqueue(&mut out, report);
    overlap(&mut out, report);
    let failures = report.failures();
    if !failures.is_empty() {
        out.push_str("\nDATA CHECK FAILED (figures marked !): the data that arrived differs from the source:\n");
        for f in failures {
            let _ = writeln!(out, "  {f}");
        }
    }
    if !report.not_measured.is_empty() {
        out.push_str("\nNOT MEASURED (the section stopped at an error; the others ran):\n");
        for n in &report.not_measured {
            let _ = writeln!(out, "  {n}");
        }
    }
    out
}

fn header(out: &mut String, report: &Report) {
    let h = &report.header;
    let d = &h.device;
    let _ = writeln!(
        out,
        "pinbench {} ({} run, {:.1} s)",
        env!("CARGO_PKG_VERSION"),
        if report.quick { "quick" } else { "full" },
        report.wall_seconds
    );
    let _ = writeln!(
        out,
        "device {}: {}, compute capability {}.{}, {:.1} GiB, PCI {}, {} copy engines ({} CUDA device{})",
        d.ordinal,
        d.name,
        d.compute_capability.0,
        d.compute_capability.1,
        d.memory_bytes as f64 / f64::from(1u32 << 30),
        d.pci_bus_id,
        d.copy_engines,
        h.device_count,
        if h.device_count == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        out,
        "driver: NVIDIA {}, supports CUDA {} ({})",
        h.nvidia_driver
            .as_deref()
            .unwrap_or("release unknown (NVML unavailable)"),
        h.cuda_version_text(),
        h.driver_library
    );
    match &h.pcie {
        Some(l) => {
            let _ = writeln!(
                out,
                "PCIe: gen {} x{} under load (the GPU supports up to gen {} x{})",
                l.generation, l.width, l.max_generation, l.max_width
            );
        }
        None => out.push_str("PCIe: unknown (NVML, libnvidia-ml.so.1, could not be read)\n"),
    }
}

/// A column of a bandwidth table: a method, safe or raw.
fn columns() -> Vec<(Method, Api, String)> {
    let mut columns = Vec::new();
    for method in Method::MEASURED {
        if method == Method::Pinned {
            columns.push((method, Api::Raw, "raw pinned".to_string()));
        }
        columns.push((method, Api::Safe, method.label().to_string()));
    }
    columns
}

fn bandwidth(out: &mut String, report: &Report, direction: Direction) {
    let sizes = report.sizes();
    if sizes.is_empty() {
        return;
    }
    let what = match direction {
        Direction::Upload => "upload (host to device)",
        Direction::Download => "download (device to host)",
    };
    let _ = writeln!(
        out,
        "\n{what}, GB/s, median per copy (event-timed); (0.99) = ratio to the raw driver call on the same \
         memory; (3.50x) = staged / the driver's pageable path at the same size"
    );
    let columns = columns();
    let _ = write!(out, "{:>8}", "size");
    for (_, _, title) in &columns {
        let _ = write!(out, " {title:>15}");
    }
    out.push('\n');
    for &bytes in &sizes {
        let _ = write!(out, "{:>8}", size_label(bytes));
        for &(method, api, _) in &columns {
            let cell = match report.find(method, api, direction, bytes) {
                None => "-".to_string(),
                Some(b) => {
                    let mut cell = format!("{:.2}", b.gb_per_s());
                    if let Some(r) = report.ratio_to_raw(b) {
                        let _ = write!(cell, " ({r:.2})");
                    }
                    if let Some(r) = report.ratio_to_pageable(b) {
                        let _ = write!(cell, " ({r:.2}x)");
                    }
                    if !b.verified {
                        cell.push('!');
                    }
                    cell
                }
            };
            let _ = write!(out, " {cell:>15}");
        }
        out.push('\n');
    }
}

/// Staged against the driver's pageable path in turns: one row per size, the median ratio and its spread each
/// way.
fn staged_turns(out: &mut String, report: &Report) {
    let Some(first) = report.staged_turns.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "\nstaged / driver's pageable path, batches taken in turns through one Vec ({} rounds): median ratio \
         (p10-p90)",
        first.rounds
    );
    let _ = writeln!(out, "{:>8} {:>22} {:>22}", "size", "upload", "download");
    let mut sizes: Vec<usize> = report.staged_turns.iter().map(|t| t.bytes).collect();
    sizes.dedup();
    for bytes in sizes {
        let _ = write!(out, "{:>8}", size_label(bytes));
        for direction in Direction::BOTH {
            let cell = report
                .staged_turns
                .iter()
                .find(|t| t.bytes == bytes && t.direction == direction)
                .map_or("-".to_string(), |t| {
                    format!(
                        "{:.2}x ({:.2}-{:.2})",
                        t.ratio.median, t.ratio.p10, t.ratio.p90
                    )
                });
            let _ = write!(out, " {cell:>22}");
        }
        out.push('\n');
    }
}

fn staging_sweep(out: &mut String, sweep: &StagingSweep) {
    let (chunks, threads) = (sweep.chunk_sizes(), sweep.thread_counts());
    if chunks.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nstaging sweep: staged transfers of {}, GB/s, median per copy; (3.50x) = ratio to the driver's \
         pageable path at the same size; * = the default ({} chunks, {} threads); pool budget {}",
        size_label(sweep.bytes),
        size_label(sweep.default_chunk_bytes),
        sweep.default_threads,
        size_label(sweep.pool_budget)
    );
    for direction in Direction::BOTH {
        let pageable = sweep.pageable(direction).map_or("-".to_string(), |b| {
            format!("{:.2}{}", b.gb_per_s(), if b.verified { "" } else { "!" })
        });
        let _ = writeln!(out, "{} (pageable: {pageable} GB/s)", direction.key());
        let _ = write!(out, "{:>8}", "chunk");
        for &t in &threads {
            let title = format!("{t} thread{}", if t == 1 { "" } else { "s" });
            let _ = write!(out, " {title:>15}");
        }
        out.push('\n');
        for &chunk in &chunks {
            let _ = write!(out, "{:>8}", size_label(chunk));
            for &t in &threads {
                let cell = match sweep.find(direction, chunk, t) {
                    None => "-".to_string(),
                    Some(p) => {
                        let mut cell = format!("{:.2}", p.figure.gb_per_s());
                        if let Some(r) = sweep.ratio_to_pageable(p) {
                            let _ = write!(cell, " ({r:.2}x)");
                        }
                        if (chunk, t) == (sweep.default_chunk_bytes, sweep.default_threads) {
                            cell.push('*');
                        }
                        if !p.figure.verified {
                            cell.push('!');
                        }
                        cell
                    }
                };
                let _ = write!(out, " {cell:>15}");
            }
            out.push('\n');
        }
        if let Some(best) = sweep.best(direction) {
            let _ = writeln!(
                out,
                "  fastest: {} chunks, {} threads, {:.2} GB/s",
                size_label(best.chunk_bytes),
                best.threads,
                best.figure.gb_per_s()
            );
        }
    }
}

fn bidirectional(out: &mut String, report: &Report) {
    if report.bidirectional.is_empty() {
        return;
    }
    out.push_str(
        "\nboth directions at once: pinned upload and download on two streams, GB/s (median)\n",
    );
    let _ = writeln!(
        out,
        "{:>8} {:>10} {:>10} {:>16} {:>14}",
        "size", "up alone", "down alone", "both, aggregate", "of up + down"
    );
    for b in &report.bidirectional {
        let _ = writeln!(
            out,
            "{:>8} {:>10.2} {:>10.2} {:>16} {:>14}",
            size_label(b.bytes),
            crate::results::gb_per_s(b.bytes, b.upload_seconds),
            crate::results::gb_per_s(b.bytes, b.download_seconds),
            format!(
                "{:.2}{}",
                b.aggregate_gb_per_s(),
                if b.verified { "" } else { "!" }
            ),
            format!("{:.2}x", b.ratio_to_sum())
        );
    }
}

fn allocation(out: &mut String, report: &Report) {
    if report.allocation.is_empty() {
        return;
    }
    out.push_str(
        "\nallocation (host time, median; [4.00x] = how many times faster than the Pinned::zeroed figure \
         of the same kind):\n",
    );
    for a in &report.allocation {
        let figure = if a.what.per_call() {
            format!("{} per call", per_call(a.seconds))
        } else {
            format!("{:.3} s per GiB", a.seconds_per_gib())
        };
        let samples = if a.batch > 1 {
            format!("(median of {} batches of {})", a.samples, a.batch)
        } else {
            format!("(median of {})", a.samples)
        };
        let _ = write!(
            out,
            "  {:<34} {:>8}  {figure:<18} {samples:<32}",
            a.what.label(),
            size_label(a.bytes),
        );
        if let Some((reference, speedup)) = report.alloc_speedup(a) {
            let _ = write!(out, " [{speedup:.2}x: {} / this]", reference.label());
        }
        let end = out.trim_end_matches(' ').len();
        out.truncate(end);
        out.push('\n');
    }
}

/// A time per call in the unit that suits it: `85.3 ns`, `12.40 us`, `0.412 ms`.
fn per_call(seconds: f64) -> String {
    if seconds < 1e-6 {
        format!("{:.1} ns", seconds * 1e9)
    } else if seconds < 1e-4 {
        format!("{:.2} us", seconds * 1e6)
    } else {
        format!("{:.3} ms", seconds * 1e3)
    }
}

/// `+0.05 us (p10 +0.02, p90 +0.09)`.
fn extra(e: &Extra) -> String {
    format!(
        "{:+.2} us (p10 {:+.2}, p90 {:+.2})",
        e.median * 1e6,
        e.p10 * 1e6,
        e.p90 * 1e6
    )
}

fn enqueue(out: &mut String, report: &Report) {
    let Some(e) = &report.enqueue else {
        out.push_str("\nenqueue overhead: not measured (see NOT MEASURED below)\n");
        return;
    };
    let _ = writeln!(
        out,
        "\nenqueueing a {}-byte upload from pinned memory (host time per call, median of {} batches of {}, the \
         four ways in turns; the stream's context current on the thread):",
        e.bytes, e.samples, e.batch
    );
    let _ = writeln!(
        out,
        "  {:<44} {:>8.2} us",
        "raw cuMemcpyHtoDAsync_v2",
        e.raw * 1e6
    );
    for (label, seconds) in [
        ("Stream::upload, one stream (no event)", e.same_stream),
        (
            "raw, alternating two streams (record + wait)",
            e.raw_cross_stream,
        ),
        ("Stream::upload, alternating two streams", e.cross_stream),
    ] {
        let _ = writeln!(
            out,
            "  {label:<44} {:>8.2} us  ({:.2}x raw, raw + {:.2} us)",
            seconds * 1e6,
            seconds / e.raw,
            (seconds - e.raw) * 1e6
        );
    }
    let _ = writeln!(
        out,
        "  the crate over its reference, batch by batch:\n    one stream over raw {}\n    two streams over the \
         raw record + wait {}",
        extra(&e.same_stream_extra),
        extra(&e.cross_stream_extra)
    );
    let n = &e.no_context;
    let _ = writeln!(
        out,
        "  from a thread with no context current (the raw calls keep theirs):\n    Stream::upload, one stream \
         {:.2} us, over raw {}\n    Stream::upload, alternating two streams {:.2} us, over the raw record + \
         wait {}",
        n.same_stream * 1e6,
        extra(&n.same_stream_extra),
        n.cross_stream * 1e6,
        extra(&n.cross_stream_extra)
    );
    let l = match &e.launch {
        Ok(l) => l,
        Err(why) => {
            let _ = writeln!(out, "\nlaunching a kernel of 2 buffers and 2 values: {why}");
            return;
        }
    };
    let _ = writeln!(
        out,
        "\nlaunching a kernel of 2 buffers and 2 values, 1 block of {} threads, on one stream (host time per \
         launch, median of {} batches of {}, raw and crate in turns):",
        costs::LAUNCH_THREADS,
        l.samples,
        e.batch
    );
    let _ = writeln!(
        out,
        "  kernel launch: raw {:.2} us, crate {:.2} us (raw + {:.2} us){}\n    the crate over raw, batch by batch: {}",
        l.raw * 1e6,
        l.crate_launch * 1e6,
        (l.crate_launch - l.raw) * 1e6,
        if l.verified { "" } else { "  ! wrong output" },
        extra(&l.extra)
    );
    let _ = writeln!(
        out,
        "    from a thread with no context current: crate {:.2} us, over raw {}",
        l.crate_launch_no_context * 1e6,
        extra(&l.extra_no_context)
    );
}

fn overlap(out: &mut String, report: &Report) {
    let Some(o) = &report.overlap else {
        let stopped = report
            .not_measured
            .iter()
            .any(|n| n.starts_with("overlap: "));
        out.push_str(if stopped {
            "\noverlap: not measured (see NOT MEASURED below)\n"
        } else {
            "\noverlap: not built in (build with --features gpu)\n"
        });
        return;
    };
    let _ = writeln!(
        out,
        "\noverlap: {} uploads of {}, each followed by a kernel of {:.3} ms (median of {}):",
        o.chunks,
        size_label(o.chunk_bytes),
        o.spin_seconds * 1e3,
        o.samples
    );
    let _ = writeln!(
        out,
        "  copies alone {:.2} ms, kernels alone {:.2} ms, ideal max(copies, kernels) {:.2} ms",
        o.copy_seconds * 1e3,
        o.kernel_seconds * 1e3,
        o.ideal_seconds() * 1e3
    );
    for (label, seconds) in [
        ("one stream", o.one_stream_seconds),
        ("copy + compute streams, 3 buffers", o.two_streams_seconds),
    ] {
        let _ = writeln!(
            out,
            "  {label:<44} {:>8.2} ms  ({:.2}x ideal)",
            seconds * 1e3,
            seconds / o.ideal_seconds()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::sample_report;

    #[test]
    fn the_table_has_every_section_and_ratios() {
        let text = table(&sample_report());
        for needle in [
            "device 0: Test GPU <&>, compute capability 9.0",
            "NVIDIA 580.1",
            "supports CUDA 13.0",
            "PCIe: gen 5 x16 under load (the GPU supports up to gen 5 x16)",
            "upload (host to device)",
            "download (device to host)",
            "raw pinned",
            "(0.50)",
            "both directions at once",
            "Pinned::zeroed, cold",
            "0.400 s per GiB",
            "(2.00x raw, raw + 1.00 us)",
            "1 block of 32 threads, on one stream",
            "kernel launch: raw 2.00 us, crate 2.25 us (raw + 0.25 us)\n",
            " staged ",
            "(3.50x)",
            "(3.50x) = staged / the driver's pageable path",
            "PinnedPool::alloc + drop, warm",
            "125.0 ns per call",
            "0.250 ms per call",
            "(median of 25 batches of 1000)",
            "[2000.00x: Pinned::zeroed, per call / this]",
            "PinnedPool::alloc, cold, Register",
            "[4.00x: Pinned::zeroed, cold / this]",
            "PinnedPool::alloc, cold, HostAlloc",
            "[2.00x: Pinned::zeroed, cold / this]",
            "staging sweep: staged transfers of 256 MiB",
            "* = the default (8 MiB chunks, 4 threads); pool budget 512 MiB",
            "upload (pageable: 8.00 GB/s)",
            "download (pageable: 8.00 GB/s)",
            "32.00 (4.00x)*",
            "fastest: 8 MiB chunks, 4 threads, 32.00 GB/s",
            "overlap: not built in (build with --features gpu)",
            "one stream over raw +0.02 us (p10 -0.01, p90 +0.05)",
            "two streams over the raw record + wait +0.50 us (p10 +0.40, p90 +0.70)",
            "the crate over raw, batch by batch: +0.25 us (p10 +0.20, p90 +0.30)",
            "staged / driver's pageable path, batches taken in turns through one Vec (9 rounds)",
            "  64 MiB      1.25x (1.10-1.40)      1.25x (1.10-1.40)",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(!text.contains("DATA CHECK FAILED"));
    }

    #[test]
    fn the_sweep_table_has_a_row_per_chunk_and_a_column_per_thread_count() {
        let text = table(&sample_report());
        let start = text.find("staging sweep").unwrap();
        let sweep = &text[start..text.find("both directions at once").unwrap()];
        assert_eq!(
            sweep
                .matches("   chunk        1 thread       4 threads")
                .count(),
            2,
            "{sweep}"
        );
        assert_eq!(sweep.matches("   4 MiB ").count(), 2, "{sweep}");
        assert_eq!(
            sweep.matches('*').count(),
            3,
            "the legend and one cell per direction: {sweep}"
        );
        let mut report = sample_report();
        report.staging_sweep = None;
        assert!(!table(&report).contains("staging sweep"));
    }

    #[test]
    fn times_per_call_take_the_unit_that_suits_them() {
        assert_eq!(per_call(85.3e-9), "85.3 ns");
        assert_eq!(per_call(12.4e-6), "12.40 us");
        assert_eq!(per_call(0.412e-3), "0.412 ms");
    }

    #[test]
    fn a_section_that_stopped_is_listed_and_the_others_print() {
        let mut report = sample_report();
        report.enqueue = None;
        report.not_measured = vec!["enqueue overhead: CUDA_ERROR_UNKNOWN".into()];
        let text = table(&report);
        assert!(
            text.contains("\nenqueue overhead: not measured (see NOT MEASURED below)\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "\nNOT MEASURED (the section stopped at an error; the others ran):\n  enqueue overhead: \
                 CUDA_ERROR_UNKNOWN\n"
            ),
            "{text}"
        );
        // The sections that ran are all there.
        assert!(text.contains("\nallocation (host time, median;"), "{text}");
        let v = serde_json::to_value(crate::json::document(&report, None)).unwrap();
        assert_eq!(v["enqueue"], serde_json::Value::Null);
        assert_eq!(
            v["not_measured"],
            serde_json::json!(["enqueue overhead: CUDA_ERROR_UNKNOWN"])
        );
    }

    #[test]
    fn a_launch_not_measured_says_why_and_fails_only_on_a_gpu() {
        let mut report = sample_report();
        report.enqueue.as_mut().unwrap().launch = Err("not measured: CUDA_ERROR_NOT_FOUND".into());
        let text = table(&report);
        assert!(
            text.contains(
                "\nlaunching a kernel of 2 buffers and 2 values: not measured: CUDA_ERROR_NOT_FOUND\n"
            ),
            "{text}"
        );
        assert_eq!(
            report.failures(),
            ["kernel launch: not measured: CUDA_ERROR_NOT_FOUND"]
        );
        // On the simulated driver the figure is not taken, which is no failure.
        report.header.simulated = true;
        report.enqueue.as_mut().unwrap().launch = Err(crate::costs::NO_STAND_IN.into());
        assert!(report.failures().is_empty());
        assert!(table(&report).contains(crate::costs::NO_STAND_IN));
    }

    #[test]
    fn failed_checks_are_marked_and_listed() {
        let mut report = sample_report();
        report.bandwidth[0].verified = false;
        let text = table(&report);
        assert!(text.contains("DATA CHECK FAILED"), "{text}");
        assert!(text.contains("pageable safe upload of 4 KiB"), "{text}");
        assert!(!text.contains("! wrong output"), "{text}");
        crate::testdata::launch_of(&mut report).verified = false;
        let text = table(&report);
        assert!(text.contains("(raw + 0.25 us)  ! wrong output"), "{text}");
        assert!(
            text.contains("kernel launch (the kernel's output, y = a * x)"),
            "{text}"
        );
        assert!(text.contains('!'));
    }
}
