//! The figures as a table for people, and as the JSON document of `--json` (which `scripts/torch-devices.py`
//! writes too, with the same keys).

use std::fmt::Write as _;

use serde::Serialize;

use super::{Figure, Figures, PrefetchedGathers, Route, Together};
use crate::nvml::Link;
use crate::results::size_label;

/// `13.0` from `13000`.
fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

/// The figures as a table.
#[must_use]
pub fn table(f: &Figures) -> String {
    let mut out = String::new();
    let n = f.devices.len();
    let _ = writeln!(
        out,
        "pinbench {} devices ({} run, {:.1} s): {n} CUDA device{}, copies of {}, GB/s (decimal), medians",
        env!("CARGO_PKG_VERSION"),
        if f.quick { "quick" } else { "full" },
        f.wall_seconds,
        if n == 1 { "" } else { "s" },
        size_label(f.bytes),
    );
    let _ = writeln!(
        out,
        "driver: NVIDIA {}, supports CUDA {} ({})",
        f.nvidia_driver
            .as_deref()
            .unwrap_or("release unknown (NVML unavailable)"),
        cuda_version_text(f.cuda_version),
        f.driver_library
    );
    let name_width = f
        .devices
        .iter()
        .map(|d| d.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let _ = writeln!(
        out,
        "\n{:>6}  {:<name_width$}  {:<13} {:>4} {:>6}  {:<26} {:>8} {:>9}",
        "device", "name", "PCI", "NUMA", "pinned", "PCIe (under load, max)", "upload", "download"
    );
    for d in &f.devices {
        let link = d.pcie.map_or_else(
            || "unknown (no NVML)".to_string(),
            |l| {
                format!(
                    "gen {} x{} (gen {} x{})",
                    l.generation, l.width, l.max_generation, l.max_width
                )
            },
        );
        let _ = writeln!(
            out,
            "{:>6}  {:<name_width$}  {:<13} {:>4} {:>6}  {:<26} {:>8} {:>9}",
            d.ordinal,
            d.name,
            d.pci_bus_id,
            node(d.numa_node),
            node(d.pinned_numa_node),
            link,
            gbps(d.upload.gb_per_s(), d.upload.verified),
            gbps(d.download.gb_per_s(), d.download.verified),
        );
    }
    let _ = writeln!(
        out,
        "NUMA: the device's node, as sysfs gives it; pinned: the node the library places pinned memory for it on \
         (- where it binds none and the OS places it, as on a host of one node)"
    );
    let alone = &f.first_alone;
    let _ = writeln!(
        out,
        "\nuploads to all devices at once, host wall time from a common start to the last device's end \
         ({} x {} per device per round, median of {} rounds):",
        alone.copies_per_round,
        size_label(alone.bytes),
        f.host_to_all.rounds
    );
    let _ = writeln!(
        out,
        "  device 0 alone, timed the same way: {}",
        gbps(alone.gb_per_s(), alone.verified)
    );
    for (what, t) in [
        ("each from its own pinned memory:  ", &f.host_to_all),
        ("from one shared pinned buffer:    ", &f.shared_to_all),
    ] {
        let _ = writeln!(
            out,
            "  {what}  {} ({:.2}x device 0 alone; {:.2}x the devices' uploads alone added up, {:.1})",
            gbps(t.gb_per_s(), t.verified),
            f.ratio_to_first(t),
            t.gb_per_s() / f.sum_alone(),
            f.sum_alone()
        );
    }
    matrix_table(&mut out, f);
    gathers_table(&mut out, &f.prefetched_gathers);
    let failures = f.failures();
    if !failures.is_empty() {
        out.push_str("\nDATA CHECK FAILED (figures marked !): the data that arrived differs from the source:\n");
        for failure in failures {
            let _ = writeln!(out, "  {failure}");
        }
    }
    out
}

/// A NUMA node, `-` for none.
fn node(node: Option<u32>) -> String {
    node.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// The prefetched gathers: device 0 alone, every device, the ratio; or why they were not measured.
fn gathers_table(out: &mut String, g: &PrefetchedGathers) {
    let _ = write!(
        out,
        "\nprefetched gathers: Prefetcher::sharded of GatherBatch, one feed per device, each device's gather \
         kernel reading {} rows at random indices from one {} table of mapped pinned memory (NUMA node {}); {} \
         batches of {} per device, host wall time from a common start to the last device's end",
        size_label(g.row_bytes),
        size_label(g.table_bytes),
        node(g.table_numa_node),
        g.batches_per_device,
        size_label(g.bytes_per_batch),
    );
    let fed = match &g.result {
        Ok(fed) => fed,
        Err(why) => {
            let _ = writeln!(out, ":\n  not measured: {why}");
            return;
        }
    };
    let _ = writeln!(out, " (median of {} rounds):", fed.rounds);
    let (Some(one), Some(all), Some(ratio)) = (
        g.one_device_gb_per_s(),
        g.all_devices_gb_per_s(),
        g.ratio_to_one_device(),
    ) else {
        return;
    };
    let n = g.devices.len();
    let all_label = format!("all {n} device{}:", if n == 1 { "" } else { "s" });
    let _ = writeln!(
        out,
        "  {:<17} {}",
        "device 0 alone:",
        gbps(one, fed.verified)
    );
    let _ = writeln!(
        out,
        "  {all_label:<17} {} ({ratio:.2}x device 0 alone)",
        gbps(all, fed.verified)
    );
}

/// GB/s with one decimal, `!` after a figure whose data did not arrive intact.
fn gbps(value: f64, verified: bool) -> String {
    format!("{value:.1}{}", if verified { "" } else { " !" })
}

/// The copy matrix: a row per source, a column per destination.
fn matrix_table(out: &mut String, f: &Figures) {
    let n = f.devices.len();
    let _ = writeln!(
        out,
        "\ncopies between devices on the destination's stream, GB/s (a row per source, a column per \
         destination; the diagonal copies within a device, its bytes counted once; between two devices, direct \
         with peer access, or * staged through pinned memory, as the two cannot access each other's memory):"
    );
    let _ = write!(out, "{:>9}", "src\\dst");
    for dst in 0..n {
        let _ = write!(out, " {dst:>10}");
    }
    out.push('\n');
    for src in 0..n {
        let _ = write!(out, "{src:>9}");
        for dst in 0..n {
            let cell = f.peer.iter().find(|c| c.src == src && c.dst == dst);
            let text = match cell {
                None => "-".to_string(),
                Some(c) => {
                    let mark = if c.route == Some(Route::Staged) {
                        "*"
                    } else {
                        ""
                    };
                    match &c.result {
                        Ok(figure) => format!("{mark}{}", gbps(figure.gb_per_s(), figure.verified)),
                        Err(_) => format!("{mark}error"),
                    }
                }
            };
            let _ = write!(out, " {text:>10}");
        }
        out.push('\n');
    }
    let errors = f.errors();
    if !errors.is_empty() {
        out.push_str("copies that failed:\n");
        for e in errors {
            let _ = writeln!(out, "  {e}");
        }
    }
}

/// The document `pinbench devices --json` prints (and `scripts/torch-devices.py` prints with the same keys).
#[derive(Debug, Serialize)]
pub struct Document<'a> {
    tool: &'static str,
    version: &'static str,
    /// What moved the bytes: `cuda-pinned` here, `torch` in the script.
    library: &'static str,
    mode: &'static str,
    quick: bool,
    bytes: usize,
    wall_seconds: f64,
    units: Units,
    header: HeaderJson<'a>,
    devices: Vec<DeviceJson<'a>>,
    host_to_all: TogetherJson,
    shared_to_all: TogetherJson,
    peer: PeerJson,
    prefetched_gathers: GathersJson,
    failures: Vec<String>,
    errors: Vec<String>,
}

/// What the keys' units mean.
#[derive(Debug, Serialize)]
pub(super) struct Units {
    gb_per_s: &'static str,
    seconds: &'static str,
    bytes: &'static str,
    ratio_to_first_device: &'static str,
    ratio_to_sum_alone: &'static str,
    ratio_to_one_device: &'static str,
}

pub(super) const UNITS: Units = Units {
    gb_per_s: "decimal gigabytes (1e9 bytes) per second",
    seconds: "seconds: devices[] and peer copies are device times from CUDA events, medians per copy; host_to_all, \
              shared_to_all and prefetched_gathers are host wall times per round, from the threads' common start \
              to the last device's end, medians",
    bytes: "bytes",
    ratio_to_first_device: "aggregate GB/s over device 0 uploading alone, timed the same way (host wall time)",
    ratio_to_sum_alone: "aggregate GB/s over the sum of the devices' event-timed uploads alone (devices[])",
    ratio_to_one_device: "GB/s fed to every device at once over GB/s fed to device 0 alone, timed the same way \
                          (prefetched_gathers)",
};

/// The machine.
#[derive(Debug, Serialize)]
struct HeaderJson<'a> {
    device_count: usize,
    nvidia_driver: Option<&'a str>,
    /// `13.0`.
    cuda_version: String,
    driver_library: &'a str,
}

/// One device.
#[derive(Debug, Serialize)]
struct DeviceJson<'a> {
    ordinal: usize,
    name: &'a str,
    pci_bus_id: &'a str,
    numa_node: Option<u32>,
    pinned_numa_node: Option<u32>,
    pcie: Option<Link>,
    upload_gb_per_s: f64,
    upload_seconds: f64,
    download_gb_per_s: f64,
    download_seconds: f64,
    samples: usize,
    verified: bool,
}

/// An all-at-once figure.
#[derive(Debug, Serialize)]
struct TogetherJson {
    devices: Vec<usize>,
    /// Bytes each device uploads per round: `copies_per_round` copies of the run's `bytes`.
    bytes_per_device: usize,
    copies_per_round: usize,
    aggregate_gb_per_s: f64,
    seconds: f64,
    rounds: usize,
    first_device_alone_gb_per_s: f64,
    ratio_to_first_device: f64,
    sum_alone_gb_per_s: f64,
    ratio_to_sum_alone: f64,
    verified: bool,
}

/// The prefetched gathers; the figures `null` where not measured, and `error` says why.
#[derive(Debug, Serialize)]
struct GathersJson {
    devices: Vec<usize>,
    table_bytes: usize,
    table_numa_node: Option<u32>,
    row_bytes: usize,
    bytes_per_batch: usize,
    batches_per_device: usize,
    rounds: Option<usize>,
    one_device_gb_per_s: Option<f64>,
    one_device_seconds: Option<f64>,
    all_devices_gb_per_s: Option<f64>,
    all_devices_seconds: Option<f64>,
    ratio_to_one_device: Option<f64>,
    verified: Option<bool>,
    error: Option<String>,
}

/// The copy matrix.
#[derive(Debug, Serialize)]
struct PeerJson {
    /// `[src][dst]`, `null` where the copy failed.
    matrix_gb_per_s: Vec<Vec<Option<f64>>>,
    copies: Vec<PeerCopyJson>,
}

/// One cell of the matrix.
#[derive(Debug, Serialize)]
struct PeerCopyJson {
    src: usize,
    dst: usize,
    /// `local` or `peer`.
    kind: &'static str,
    peer_access: Option<bool>,
    /// `direct` or `staged`; `null` on the diagonal, or where enabling peer access failed.
    route: Option<&'static str>,
    gb_per_s: Option<f64>,
    seconds: Option<f64>,
    samples: Option<usize>,
    verified: Option<bool>,
    error: Option<String>,
}

/// The figures as the JSON document.
#[must_use]
pub fn document(f: &Figures) -> Document<'_> {
    let together = |t: &Together| TogetherJson {
        devices: t.devices.clone(),
        bytes_per_device: t.bytes * t.copies_per_round,
        copies_per_round: t.copies_per_round,
        aggregate_gb_per_s: t.gb_per_s(),
        seconds: t.seconds,
        rounds: t.rounds,
        first_device_alone_gb_per_s: f.first_alone.gb_per_s(),
        ratio_to_first_device: f.ratio_to_first(t),
        sum_alone_gb_per_s: f.sum_alone(),
        ratio_to_sum_alone: t.gb_per_s() / f.sum_alone(),
        verified: t.verified,
    };
    Document {
        tool: "pinbench",
        version: env!("CARGO_PKG_VERSION"),
        library: "cuda-pinned",
        mode: "devices",
        quick: f.quick,
        bytes: f.bytes,
        wall_seconds: f.wall_seconds,
        units: UNITS,
        header: HeaderJson {
            device_count: f.devices.len(),
            nvidia_driver: f.nvidia_driver.as_deref(),
            cuda_version: cuda_version_text(f.cuda_version),
            driver_library: &f.driver_library,
        },
        devices: f
            .devices
            .iter()
            .map(|d| DeviceJson {
                ordinal: d.ordinal,
                name: &d.name,
                pci_bus_id: &d.pci_bus_id,
                numa_node: d.numa_node,
                pinned_numa_node: d.pinned_numa_node,
                pcie: d.pcie,
                upload_gb_per_s: d.upload.gb_per_s(),
                upload_seconds: d.upload.timed.seconds,
                download_gb_per_s: d.download.gb_per_s(),
                download_seconds: d.download.timed.seconds,
                samples: d.upload.timed.samples.min(d.download.timed.samples),
                verified: d.upload.verified && d.download.verified,
            })
            .collect(),
        host_to_all: together(&f.host_to_all),
        shared_to_all: together(&f.shared_to_all),
        peer: PeerJson {
            matrix_gb_per_s: f.matrix(),
            copies: f
                .peer
                .iter()
                .map(|c| {
                    let figure = c.result.as_ref().ok();
                    PeerCopyJson {
                        src: c.src,
                        dst: c.dst,
                        kind: c.kind(),
                        peer_access: c.peer_access,
                        route: c.route.map(Route::name),
                        gb_per_s: figure.map(Figure::gb_per_s),
                        seconds: figure.map(|x| x.timed.seconds),
                        samples: figure.map(|x| x.timed.samples),
                        verified: figure.map(|x| x.verified),
                        error: c.result.as_ref().err().cloned(),
                    }
                })
                .collect(),
        },
        prefetched_gathers: gathers(&f.prefetched_gathers),
        failures: f.failures(),
        errors: f.errors(),
    }
}

/// The prefetched gathers as the document writes them.
fn gathers(g: &PrefetchedGathers) -> GathersJson {
    let fed = g.result.as_ref().ok();
    GathersJson {
        devices: g.devices.clone(),
        table_bytes: g.table_bytes,
        table_numa_node: g.table_numa_node,
        row_bytes: g.row_bytes,
        bytes_per_batch: g.bytes_per_batch,
        batches_per_device: g.batches_per_device,
        rounds: fed.map(|x| x.rounds),
        one_device_gb_per_s: g.one_device_gb_per_s(),
        one_device_seconds: fed.map(|x| x.one_device_seconds),
        all_devices_gb_per_s: g.all_devices_gb_per_s(),
        all_devices_seconds: fed.map(|x| x.all_devices_seconds),
        ratio_to_one_device: g.ratio_to_one_device(),
        verified: fed.map(|x| x.verified),
        error: g.result.as_ref().err().cloned(),
    }
}
