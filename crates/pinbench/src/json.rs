//! `--json`: the whole report as one JSON document. Keys name their units (`seconds`, `gb_per_s`, `bytes`);
//! `units` at the top spells them out.
//!
//! The document is the report plus what the table derives from it (GB/s, ratios, speed-ups), so each section is
//! a small serializable view built from the results; the results' own types serialize where a section shows
//! them as they are (methods, directions, the device, the PCIe link). Numbers that cannot be expressed in JSON
//! (NaN, infinities) are written as `null`.

use serde::Serialize;

use crate::nvml::Link;
use crate::results::{
    Alloc, Api, Bandwidth, DeviceInfo, Direction, Extra, Method, Overlap, Report, StagingSweep,
    gb_per_s,
};

/// The document `pinbench --json` prints.
#[derive(Debug, Serialize)]
pub struct Document<'a> {
    tool: &'static str,
    version: &'static str,
    /// `full` or `quick`.
    mode: &'static str,
    wall_seconds: f64,
    units: Units,
    header: HeaderJson<'a>,
    bandwidth: Vec<BandwidthJson>,
    /// The crate's staged path against the driver's pageable path, batches of the two taken in turns.
    staged_turns: Vec<StagedTurnsJson>,
    /// `null` where `--staging-sweep` was not asked for.
    staging_sweep: Option<SweepJson>,
    bidirectional: Vec<BidirectionalJson>,
    allocation: Vec<AllocationJson>,
    /// `null` where it could not be measured (see `not_measured`).
    enqueue: Option<EnqueueJson>,
    overlap: OverlapJson,
    failures: Vec<String>,
    /// The sections that could not be measured, each as `section: the error`; present only where there are some.
    #[serde(skip_serializing_if = "nothing")]
    not_measured: &'a [String],
    /// The SVG file written with `--plot`, or `null`.
    plot: Option<&'a str>,
}

/// Whether `list` is empty (for `skip_serializing_if`).
fn nothing(list: &&[String]) -> bool {
    list.is_empty()
}

/// What the keys' units mean, for a reader of the document without this program.
#[derive(Debug, Serialize)]
struct Units {
    gb_per_s: &'static str,
    seconds: &'static str,
    bytes: &'static str,
    ratio_to_raw: &'static str,
    ratio_to_pageable: &'static str,
    speedup: &'static str,
}

const UNITS: Units = Units {
    gb_per_s: "decimal gigabytes (1e9 bytes) per second",
    seconds: "seconds; bandwidth times are device times from CUDA events, medians per copy; allocation and \
              enqueue times are host times, medians per call",
    bytes: "bytes",
    ratio_to_raw: "safe-layer GB/s over the raw driver call's GB/s on the same memory, direction and size; for \
                   enqueue, time over the raw call's time",
    ratio_to_pageable: "staged GB/s over the driver's pageable GB/s at the same direction and size, same run",
    speedup: "allocation: the time per GiB of the figure named by speedup_over over this one's",
};

/// The machine: the device, the driver and the PCIe link.
#[derive(Debug, Serialize)]
struct HeaderJson<'a> {
    device: &'a DeviceInfo,
    device_count: usize,
    nvidia_driver: Option<&'a str>,
    /// `13.0`.
    cuda_version: String,
    driver_library: &'a str,
    /// `true` where the driver is cuda-pinned's simulated one, whose figures are a simulation's, not a GPU's;
    /// present only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    simulated_driver: bool,
    pcie: Option<PcieJson>,
}

/// The PCIe link and when it was read (an idle link drops to a slower generation, so the time matters).
#[derive(Debug, Serialize)]
struct PcieJson {
    #[serde(flatten)]
    link: Link,
    read: &'static str,
}

/// One bandwidth figure with its GB/s and ratios.
#[derive(Debug, Serialize)]
struct BandwidthJson {
    method: Method,
    api: Api,
    direction: Direction,
    bytes: usize,
    gb_per_s: f64,
    seconds: f64,
    ratio_to_raw: Option<f64>,
    ratio_to_pageable: Option<f64>,
    samples: usize,
    batch: usize,
    verified: bool,
}

/// `--staging-sweep`: the pageable reference each way, and one entry per direction, chunk size and thread count.
#[derive(Debug, Serialize)]
struct SweepJson {
    bytes: usize,
    pool_budget_bytes: usize,
    default: SweepOptionsJson,
    pageable: Vec<SweepFigureJson>,
    points: Vec<SweepPointJson>,
}

/// The staging options a sweep point (or the library's default) used.
#[derive(Debug, Serialize)]
struct SweepOptionsJson {
    chunk_bytes: usize,
    threads: usize,
}

/// A figure of the sweep (all of one size and method, so those are the sweep's).
#[derive(Debug, Serialize)]
struct SweepFigureJson {
    direction: Direction,
    gb_per_s: f64,
    seconds: f64,
    samples: usize,
    batch: usize,
    verified: bool,
}

/// One point of the sweep.
#[derive(Debug, Serialize)]
struct SweepPointJson {
    chunk_bytes: usize,
    threads: usize,
    #[serde(flatten)]
    figure: SweepFigureJson,
    ratio_to_pageable: Option<f64>,
}

/// One size and direction of the staged path against the driver's pageable path, in turns: per round, the
/// pageable batch's device time over the staged batch's (above 1: staged is faster).
#[derive(Debug, Serialize)]
struct StagedTurnsJson {
    direction: Direction,
    bytes: usize,
    batch: usize,
    rounds: usize,
    ratio_median: f64,
    ratio_p10: f64,
    ratio_p90: f64,
}

/// Both directions at once, beside each alone.
#[derive(Debug, Serialize)]
struct BidirectionalJson {
    bytes: usize,
    aggregate_gb_per_s: f64,
    both_seconds: f64,
    upload_alone_gb_per_s: f64,
    download_alone_gb_per_s: f64,
    ratio_to_sum_alone: f64,
    samples: usize,
    verified: bool,
}

/// One allocation figure, with its speed-up over its reference where it has one.
#[derive(Debug, Serialize)]
struct AllocationJson {
    what: Alloc,
    bytes: usize,
    seconds: f64,
    seconds_per_gib: f64,
    samples: usize,
    batch: usize,
    speedup_over: Option<Alloc>,
    speedup: Option<f64>,
}

/// A call's cost over its reference's, batch by batch: the median difference and its 10th and 90th percentiles.
#[derive(Debug, Serialize)]
struct ExtraJson {
    median_seconds: f64,
    p10_seconds: f64,
    p90_seconds: f64,
}

impl From<&Extra> for ExtraJson {
    fn from(e: &Extra) -> ExtraJson {
        ExtraJson {
            median_seconds: e.median,
            p10_seconds: e.p10,
            p90_seconds: e.p90,
        }
    }
}

/// The enqueue overhead, in seconds per call and as ratios to the raw call.
#[derive(Debug, Serialize)]
struct EnqueueJson {
    bytes: usize,
    raw_seconds: f64,
    same_stream_seconds: f64,
    cross_stream_seconds: f64,
    raw_cross_stream_seconds: f64,
    same_stream_ratio_to_raw: f64,
    cross_stream_ratio_to_raw: f64,
    /// `Stream::upload` on one stream over the raw call, batch by batch (the four ways take turns).
    same_stream_over_raw: ExtraJson,
    /// `Stream::upload` alternating two streams over the raw record + wait + copy, batch by batch.
    cross_stream_over_raw_cross_stream: ExtraJson,
    /// The two `Stream::upload` figures from a thread with no context current (the raw ones keep theirs).
    no_context_same_stream_seconds: f64,
    no_context_cross_stream_seconds: f64,
    no_context_same_stream_over_raw: ExtraJson,
    no_context_cross_stream_over_raw_cross_stream: ExtraJson,
    batch: usize,
    samples: usize,
    /// A small kernel launched through the raw `cuLaunchKernel`, on one stream (the launch figures are null
    /// where they could not be taken: see `kernel_launch_error`).
    kernel_launch_raw_seconds: Option<f64>,
    /// The same launch through `Stream::launch`, on the same stream.
    kernel_launch_seconds: Option<f64>,
    kernel_launch_ratio_to_raw: Option<f64>,
    /// `Stream::launch`'s time less the raw launch's.
    kernel_launch_over_raw_seconds: Option<f64>,
    /// The same, batch by batch.
    kernel_launch_over_raw: Option<ExtraJson>,
    /// `Stream::launch` from a thread with no context current, and its extra over the raw launch.
    kernel_launch_no_context_seconds: Option<f64>,
    kernel_launch_no_context_over_raw: Option<ExtraJson>,
    /// Batches (of `batch` launches) the two launch medians are taken over, each way.
    kernel_launch_samples: usize,
    /// Whether the kernel's output was as expected.
    kernel_launch_verified: bool,
    /// Why the launch figures are null; present only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_launch_error: Option<String>,
}

/// The overlap pipeline, or a note that this build has no kernels to run it with.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum OverlapJson {
    NotBuilt {
        built: bool,
        note: &'static str,
    },
    Built {
        built: bool,
        chunks: usize,
        chunk_bytes: usize,
        spin_seconds: f64,
        copy_seconds: f64,
        kernel_seconds: f64,
        ideal_seconds: f64,
        one_stream_seconds: f64,
        two_streams_seconds: f64,
        one_stream_ratio_to_ideal: f64,
        two_streams_ratio_to_ideal: f64,
        samples: usize,
    },
}

/// The report as the JSON document; `plot` is the SVG file written beside it, if any.
pub fn document<'a>(report: &'a Report, plot: Option<&'a str>) -> Document<'a> {
    let h = &report.header;
    Document {
        tool: "pinbench",
        version: env!("CARGO_PKG_VERSION"),
        mode: if report.quick { "quick" } else { "full" },
        wall_seconds: report.wall_seconds,
        units: UNITS,
        header: HeaderJson {
            device: &h.device,
            device_count: h.device_count,
            nvidia_driver: h.nvidia_driver.as_deref(),
            cuda_version: h.cuda_version_text(),
            driver_library: &h.driver_library,
            simulated_driver: h.simulated,
            pcie: h.pcie.map(|link| PcieJson {
                link,
                read: "under load",
            }),
        },
        bandwidth: report
            .bandwidth
            .iter()
            .map(|b| BandwidthJson {
                method: b.method,
                api: b.api,
                direction: b.direction,
                bytes: b.bytes,
                gb_per_s: b.gb_per_s(),
                seconds: b.seconds,
                ratio_to_raw: report.ratio_to_raw(b),
                ratio_to_pageable: report.ratio_to_pageable(b),
                samples: b.samples,
                batch: b.batch,
                verified: b.verified,
            })
            .collect(),
        staged_turns: report
            .staged_turns
            .iter()
            .map(|t| StagedTurnsJson {
                direction: t.direction,
                bytes: t.bytes,
                batch: t.batch,
                rounds: t.rounds,
                ratio_median: t.ratio.median,
                ratio_p10: t.ratio.p10,
                ratio_p90: t.ratio.p90,
            })
            .collect(),
        staging_sweep: report.staging_sweep.as_ref().map(sweep),
        bidirectional: report
            .bidirectional
            .iter()
            .map(|b| BidirectionalJson {
                bytes: b.bytes,
                aggregate_gb_per_s: b.aggregate_gb_per_s(),
                both_seconds: b.both_seconds,
                upload_alone_gb_per_s: gb_per_s(b.bytes, b.upload_seconds),
                download_alone_gb_per_s: gb_per_s(b.bytes, b.download_seconds),
                ratio_to_sum_alone: b.ratio_to_sum(),
                samples: b.samples,
                verified: b.verified,
            })
            .collect(),
        allocation: report
            .allocation
            .iter()
            .map(|a| {
                let speedup = report.alloc_speedup(a);
                AllocationJson {
                    what: a.what,
                    bytes: a.bytes,
                    seconds: a.seconds,
                    seconds_per_gib: a.seconds_per_gib(),
                    samples: a.samples,
                    batch: a.batch,
                    speedup_over: speedup.map(|(reference, _)| reference),
                    speedup: speedup.map(|(_, x)| x),
                }
            })
            .collect(),
        enqueue: report.enqueue.as_ref().map(|e| EnqueueJson {
            bytes: e.bytes,
            raw_seconds: e.raw,
            same_stream_seconds: e.same_stream,
            cross_stream_seconds: e.cross_stream,
            raw_cross_stream_seconds: e.raw_cross_stream,
            same_stream_ratio_to_raw: e.same_stream / e.raw,
            cross_stream_ratio_to_raw: e.cross_stream / e.raw,
            same_stream_over_raw: (&e.same_stream_extra).into(),
            cross_stream_over_raw_cross_stream: (&e.cross_stream_extra).into(),
            no_context_same_stream_seconds: e.no_context.same_stream,
            no_context_cross_stream_seconds: e.no_context.cross_stream,
            no_context_same_stream_over_raw: (&e.no_context.same_stream_extra).into(),
            no_context_cross_stream_over_raw_cross_stream: (&e.no_context.cross_stream_extra)
                .into(),
            batch: e.batch,
            samples: e.samples,
            kernel_launch_raw_seconds: e.launch.as_ref().ok().map(|l| l.raw),
            kernel_launch_seconds: e.launch.as_ref().ok().map(|l| l.crate_launch),
            kernel_launch_ratio_to_raw: e.launch.as_ref().ok().map(|l| l.crate_launch / l.raw),
            kernel_launch_over_raw_seconds: e.launch.as_ref().ok().map(|l| l.crate_launch - l.raw),
            kernel_launch_over_raw: e.launch.as_ref().ok().map(|l| (&l.extra).into()),
            kernel_launch_no_context_seconds: e
                .launch
                .as_ref()
                .ok()
                .map(|l| l.crate_launch_no_context),
            kernel_launch_no_context_over_raw: e
                .launch
                .as_ref()
                .ok()
                .map(|l| (&l.extra_no_context).into()),
            kernel_launch_samples: e.launch.as_ref().map_or(0, |l| l.samples),
            kernel_launch_verified: e.launch.as_ref().is_ok_and(|l| l.verified),
            kernel_launch_error: e.launch.as_ref().err().cloned(),
        }),
        overlap: report.overlap.as_ref().map_or(
            OverlapJson::NotBuilt {
                built: false,
                note: "build with --features gpu",
            },
            overlap,
        ),
        failures: report.failures(),
        not_measured: &report.not_measured,
        plot,
    }
}

/// The sweep's section.
fn sweep(sweep: &StagingSweep) -> SweepJson {
    let figure = |b: &Bandwidth| SweepFigureJson {
        direction: b.direction,
        gb_per_s: b.gb_per_s(),
        seconds: b.seconds,
        samples: b.samples,
        batch: b.batch,
        verified: b.verified,
    };
    SweepJson {
        bytes: sweep.bytes,
        pool_budget_bytes: sweep.pool_budget,
        default: SweepOptionsJson {
            chunk_bytes: sweep.default_chunk_bytes,
            threads: sweep.default_threads,
        },
        pageable: sweep.pageable.iter().map(figure).collect(),
        points: sweep
            .points
            .iter()
            .map(|p| SweepPointJson {
                chunk_bytes: p.chunk_bytes,
                threads: p.threads,
                figure: figure(&p.figure),
                ratio_to_pageable: sweep.ratio_to_pageable(p),
            })
            .collect(),
    }
}

/// The overlap section of a build with kernels.
fn overlap(o: &Overlap) -> OverlapJson {
    OverlapJson::Built {
        built: true,
        chunks: o.chunks,
        chunk_bytes: o.chunk_bytes,
        spin_seconds: o.spin_seconds,
        copy_seconds: o.copy_seconds,
        kernel_seconds: o.kernel_seconds,
        ideal_seconds: o.ideal_seconds(),
        one_stream_seconds: o.one_stream_seconds,
        two_streams_seconds: o.two_streams_seconds,
        one_stream_ratio_to_ideal: o.one_stream_seconds / o.ideal_seconds(),
        two_streams_ratio_to_ideal: o.two_streams_seconds / o.ideal_seconds(),
        samples: o.samples,
    }
}

/// `value` as pretty-printed JSON (two-space indent), ending in a newline.
pub fn pretty(value: &impl Serialize) -> serde_json::Result<String> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::testdata::{sample_overlap, sample_report};

    /// The document of `report`, printed and parsed back.
    fn round_trip(report: &Report, plot: Option<&str>) -> Value {
        let text = pretty(&document(report, plot)).unwrap();
        assert!(text.ends_with("}\n"));
        serde_json::from_str(&text).unwrap()
    }

    /// The keys of an object, sorted.
    fn keys(v: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {v}"))
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The enqueue section's keys, in the order the document writes them.
    const ENQUEUE_KEYS: [&str; 24] = [
        "bytes",
        "raw_seconds",
        "same_stream_seconds",
        "cross_stream_seconds",
        "raw_cross_stream_seconds",
        "same_stream_ratio_to_raw",
        "cross_stream_ratio_to_raw",
        "same_stream_over_raw",
        "cross_stream_over_raw_cross_stream",
        "no_context_same_stream_seconds",
        "no_context_cross_stream_seconds",
        "no_context_same_stream_over_raw",
        "no_context_cross_stream_over_raw_cross_stream",
        "batch",
        "samples",
        "kernel_launch_raw_seconds",
        "kernel_launch_seconds",
        "kernel_launch_ratio_to_raw",
        "kernel_launch_over_raw_seconds",
        "kernel_launch_over_raw",
        "kernel_launch_no_context_seconds",
        "kernel_launch_no_context_over_raw",
        "kernel_launch_samples",
        "kernel_launch_verified",
    ];

    /// Asserts that every object in `ours` has the keys of the object at the same place in `theirs`, and no others,
    /// descending into objects and into the first element of arrays (the elements of an array share one shape).
    fn same_shape(ours: &Value, theirs: &Value, at: &str) {
        match (ours, theirs) {
            (Value::Object(a), Value::Object(b)) => {
                assert_eq!(keys(ours), keys(theirs), "keys of {at}");
                for (key, value) in a {
                    if let Some(theirs) = b.get(key) {
                        same_shape(value, theirs, &format!("{at}.{key}"));
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                if let (Some(a), Some(b)) = (a.first(), b.first()) {
                    same_shape(a, b, &format!("{at}[0]"));
                }
            }
            // A value that is null on one side (no ratio, no sweep) has nothing to compare.
            _ => {}
        }
    }

    #[test]
    fn the_document_has_the_shape_of_the_latest_committed_run() {
        // A full run on the lent H100, with the enqueue figures of both thread states, built without the
        // kernels (its overlap section is the unbuilt one).
        let h100: Value =
            serde_json::from_str(include_str!("../../../docs/bench/h100-2026-12-07.json")).unwrap();
        let ours = round_trip(&sample_report(), Some("bench.svg"));
        same_shape(&ours, &h100, "document");
        assert_eq!(ours["units"], h100["units"]);
        // The committed run had no sweep: its section is checked on its own below.
        assert!(h100["staging_sweep"].is_null());
    }

    #[test]
    fn the_overlap_section_has_the_shape_of_the_last_committed_run_with_kernels() {
        let h100: Value = serde_json::from_str(include_str!(
            "../../../docs/bench/h100-2026-11-27-turns.json"
        ))
        .unwrap();
        let mut report = sample_report();
        report.overlap = Some(sample_overlap());
        let ours = round_trip(&report, Some("bench.svg"));
        same_shape(&ours["overlap"], &h100["overlap"], "overlap");
    }

    #[test]
    fn the_document_round_trips_with_every_figure() {
        let report = sample_report();
        let v = round_trip(&report, Some("out \"x\".svg"));
        assert_eq!(v["tool"], "pinbench");
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(v["mode"], "quick");
        assert_eq!(v["wall_seconds"], 12.5);
        assert_eq!(v["plot"], "out \"x\".svg");
        assert_eq!(v["failures"], json!([]));
        assert_eq!(v["units"]["bytes"], "bytes");

        let header = &v["header"];
        assert_eq!(
            header["device"],
            json!({
                "ordinal": 0,
                "name": "Test GPU <&>",
                "compute_capability": "9.0",
                "memory_bytes": 80u64 << 30,
                "pci_bus_id": "0000:65:00.0",
                "copy_engines": 3,
            })
        );
        assert_eq!(header["cuda_version"], "13.0");
        assert_eq!(header["nvidia_driver"], "580.1");
        assert_eq!(
            header["pcie"],
            json!({"generation": 5, "width": 16, "max_generation": 5, "max_width": 16, "read": "under load"})
        );

        let rows = v["bandwidth"].as_array().unwrap();
        assert_eq!(rows.len(), report.bandwidth.len());
        let row = |method: &str, api: &str, direction: &str, bytes: u64| {
            rows.iter()
                .find(|r| {
                    r["method"] == method
                        && r["api"] == api
                        && r["direction"] == direction
                        && r["bytes"] == bytes
                })
                .unwrap_or_else(|| panic!("no {method} {api} {direction} {bytes}"))
        };
        let pinned = row("pinned", "safe", "upload", 4096);
        assert!((pinned["gb_per_s"].as_f64().unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(pinned["ratio_to_raw"], 0.5);
        assert_eq!(pinned["ratio_to_pageable"], Value::Null);
        assert_eq!(pinned["samples"], 5);
        assert_eq!(pinned["batch"], 1);
        assert_eq!(pinned["verified"], true);
        let staged = row("staged", "safe", "download", 64 << 20);
        assert!((staged["ratio_to_pageable"].as_f64().unwrap() - 3.5).abs() < 1e-9);
        assert_eq!(staged["ratio_to_raw"], Value::Null);
        assert_eq!(
            row("pinned", "raw", "upload", 4096)["ratio_to_raw"],
            Value::Null
        );

        let warm = &v["allocation"][2];
        assert_eq!(warm["what"], "pool_alloc_warm");
        assert_eq!(warm["speedup_over"], "pinned_zeroed_per_call");
        assert_eq!(warm["batch"], 1000);
        assert!((warm["speedup"].as_f64().unwrap() - 2000.0).abs() < 1e-6);
        let register = &v["allocation"][3];
        assert_eq!(register["what"], "pool_alloc_cold_register");
        assert_eq!(register["speedup_over"], "pinned_zeroed_cold");
        assert!((register["speedup"].as_f64().unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(v["allocation"][0]["speedup_over"], Value::Null);

        let both = &v["bidirectional"][0];
        assert_eq!(both["bytes"], 256 << 20);
        assert!((both["ratio_to_sum_alone"].as_f64().unwrap() - 1.0).abs() < 1e-9);
        let enqueue = &v["enqueue"];
        assert_eq!(enqueue["raw_seconds"], 1e-6);
        assert_eq!(enqueue["cross_stream_ratio_to_raw"], 2.0);
        assert_eq!(enqueue["batch"], 500);
        assert_eq!(enqueue["kernel_launch_raw_seconds"], 2e-6);
        assert_eq!(enqueue["kernel_launch_seconds"], 2.25e-6);
        let ratio = enqueue["kernel_launch_ratio_to_raw"].as_f64().unwrap();
        assert!((ratio - 1.125).abs() < 1e-9, "{ratio}");
        let over = enqueue["kernel_launch_over_raw_seconds"].as_f64().unwrap();
        assert!((over - 0.25e-6).abs() < 1e-15, "{over}");
        assert_eq!(enqueue["kernel_launch_verified"], true);
        assert_eq!(
            v["overlap"],
            json!({"built": false, "note": "build with --features gpu"})
        );
    }

    #[test]
    fn the_enqueue_keys_keep_their_order_with_the_launch_figures_last() {
        let text = pretty(&document(&sample_report(), None)).unwrap();
        let start = text.find("\"enqueue\": {").unwrap();
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        // The section's own keys, one level in (the objects of the batch-by-batch figures hold keys of their own).
        let indent = " ".repeat(start - line_start + 2);
        let written: Vec<&str> = text[start..]
            .lines()
            .skip(1)
            .take_while(|line| line.len() > indent.len() - 2 && line.starts_with(&indent))
            .filter(|line| {
                !line[indent.len()..].starts_with(' ') && !line[indent.len()..].starts_with('}')
            })
            .filter_map(|line| line.trim().split('"').nth(1))
            .collect();
        assert_eq!(written, ENQUEUE_KEYS);
    }

    #[test]
    fn a_launch_whose_output_was_wrong_is_a_failure() {
        let mut report = sample_report();
        crate::testdata::launch_of(&mut report).verified = false;
        let v = round_trip(&report, None);
        assert_eq!(v["enqueue"]["kernel_launch_verified"], false);
        assert_eq!(
            v["failures"],
            json!(["kernel launch (the kernel's output, y = a * x)"])
        );
    }

    #[test]
    fn the_sweep_section_has_the_reference_and_every_point() {
        let report = sample_report();
        let v = round_trip(&report, None);
        let sweep = &v["staging_sweep"];
        assert_eq!(sweep["bytes"], 256 << 20);
        assert_eq!(sweep["pool_budget_bytes"], 512 << 20);
        assert_eq!(
            sweep["default"],
            json!({"chunk_bytes": 8 << 20, "threads": 4})
        );
        assert_eq!(
            keys(&sweep["pageable"][0]),
            [
                "batch",
                "direction",
                "gb_per_s",
                "samples",
                "seconds",
                "verified"
            ]
        );
        let points = sweep["points"].as_array().unwrap();
        assert_eq!(points.len(), report.staging_sweep.unwrap().points.len());
        let default = points
            .iter()
            .find(|p| {
                p["chunk_bytes"] == 8 << 20 && p["threads"] == 4 && p["direction"] == "upload"
            })
            .unwrap();
        assert!((default["gb_per_s"].as_f64().unwrap() - 32.0).abs() < 1e-9);
        assert!((default["ratio_to_pageable"].as_f64().unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(default["verified"], true);
        assert_eq!(v["plot"], Value::Null);
    }

    #[test]
    fn absent_sections_and_unmeasurable_numbers_are_null() {
        let mut report = sample_report();
        report.staging_sweep = None;
        report.header.pcie = None;
        report.header.nvidia_driver = None;
        report.bandwidth[0].seconds = 0.0; // an infinite GB/s
        report.bandwidth[0].verified = false;
        report.overlap = Some(sample_overlap());
        let v = round_trip(&report, None);
        assert_eq!(v["staging_sweep"], Value::Null);
        assert_eq!(v["header"]["pcie"], Value::Null);
        assert_eq!(v["header"]["nvidia_driver"], Value::Null);
        assert_eq!(v["bandwidth"][0]["gb_per_s"], Value::Null);
        assert_eq!(v["failures"], json!(["pageable safe upload of 4 KiB"]));
        let overlap = &v["overlap"];
        assert_eq!(overlap["built"], true);
        assert_eq!(overlap["chunks"], 64);
        assert_eq!(overlap["ideal_seconds"], 0.005);
        let ratio = overlap["two_streams_ratio_to_ideal"].as_f64().unwrap();
        assert!((ratio - 1.5).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn names_in_json_are_the_keys_the_table_and_earlier_documents_use() {
        let name = |v: Value| v.as_str().unwrap().to_string();
        for method in Method::MEASURED {
            assert_eq!(name(json!(method)), method.key());
        }
        for direction in Direction::BOTH {
            assert_eq!(name(json!(direction)), direction.key());
        }
        for api in [Api::Safe, Api::Raw] {
            assert_eq!(name(json!(api)), api.key());
        }
        let allocations = [
            (Alloc::PinnedCold, "pinned_zeroed_cold"),
            (Alloc::PinnedPerCall, "pinned_zeroed_per_call"),
            (Alloc::PoolWarm, "pool_alloc_warm"),
            (Alloc::PoolColdRegister, "pool_alloc_cold_register"),
            (Alloc::PoolColdHostAlloc, "pool_alloc_cold_host_alloc"),
            (Alloc::RegisterTouched, "registered_new_touched"),
            (Alloc::RegisterUntouched, "registered_new_untouched"),
        ];
        for (what, key) in allocations {
            assert_eq!(name(json!(what)), key);
        }
    }
}
