//! `pinbench load`'s figures as a table, or as the JSON document.

use std::fmt::Write as _;

use serde::Serialize;

use super::{
    COLD_AT_MOST, Cache, Figure, Figures, Goal, SWEEP_BUFFERED_READERS,
    SWEEP_COLD_BUFFERED_READERS, SWEEP_READERS, SWEEP_SLOTS, State, WARM_AT_LEAST, human,
};
use crate::results::size_label;

/// The document `pinbench load --json` prints: the figures, under what made them and their units.
#[derive(Debug, Serialize)]
pub struct Document<'a> {
    tool: &'static str,
    version: &'static str,
    library: &'static str,
    mode: &'static str,
    /// `true` where the driver is cuda-pinned's simulated one; present only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    simulated_driver: bool,
    units: Units,
    #[serde(flatten)]
    figures: &'a Figures,
    failures: Vec<String>,
}

/// What the keys' units mean.
#[derive(Debug, Serialize)]
struct Units {
    gb_per_s: &'static str,
    seconds: &'static str,
    bytes: &'static str,
    ratio_to_ceiling: &'static str,
    ratio_to_pinned_upload: &'static str,
    resident_before: &'static str,
}

const UNITS: Units = Units {
    gb_per_s: "decimal gigabytes (1e9 bytes) per second",
    seconds: "seconds of host wall time of one run, from the call until the data is on the device (the stream \
              synchronized); the references are medians, the pinned upload's of device time from CUDA events",
    bytes: "bytes",
    ratio_to_ceiling: "GB/s over the ceiling's (reads alone) in the same state of the page cache",
    ratio_to_pinned_upload: "GB/s over the pinned upload reference's",
    resident_before: "the fraction of the file's pages in the page cache just before the figure (mincore)",
};

/// The figures as the JSON document.
#[must_use]
pub fn document(f: &Figures, simulated: bool) -> Document<'_> {
    Document {
        tool: "pinbench",
        version: env!("CARGO_PKG_VERSION"),
        library: "cuda-pinned",
        mode: "load",
        simulated_driver: simulated,
        units: UNITS,
        figures: f,
        failures: f.failures(),
    }
}

/// The names of the rows of a state's figures.
const ROWS: [&str; 5] = [
    "ceiling: reads alone",
    "Stream::load_file",
    "SafeTensorsFile::open + load",
    "pageable: fs::read + upload_pageable",
    "mmap + upload_pageable",
];

/// A state's figure as the table's cells: resident, GB/s, ratios; `!` marks a figure not in the state asked for.
fn cells(f: &Figure) -> String {
    format!(
        "{:>7.1}%{} {:>7.2} {:>6.2} {:>7.2}",
        f.resident_before * 100.0,
        if f.cache_state_reached { ' ' } else { '!' },
        f.gb_per_s,
        f.ratio_to_ceiling,
        f.ratio_to_pinned_upload
    )
}

/// How a load read, as a line.
fn how(f: &Figure) -> String {
    let mut out = if f.direct {
        "direct reads (O_DIRECT)".to_owned()
    } else {
        format!(
            "buffered: {}",
            f.why_buffered
                .as_deref()
                .unwrap_or("through the page cache")
        )
    };
    if let Some(l) = &f.loader {
        let _ = write!(
            out,
            "; {} readers, {} slots of {} ({} pinned), {} read, returned after {:.3} s of {:.3} s",
            l.readers,
            l.slots,
            size_label(l.slot_bytes),
            size_label(l.pinned_bytes),
            human(l.read_bytes),
            l.returned_seconds,
            f.seconds
        );
    }
    out
}

/// A goal, as a line's end.
fn judged(g: &Goal) -> String {
    match (g.met, &g.note) {
        (Some(true), _) => format!("{:.2} (goal >= {:.2}: met)", g.ratio, g.goal),
        (Some(false), _) => format!("{:.2} (goal >= {:.2}: missed)", g.ratio, g.goal),
        (None, note) => format!(
            "{:.2} (goal >= {:.2}; {})",
            g.ratio,
            g.goal,
            note.as_deref().unwrap_or("not judged")
        ),
    }
}

/// The figures as a table.
#[must_use]
pub fn table(f: &Figures) -> String {
    let mut out = String::new();
    let file = &f.file;
    let _ = writeln!(
        out,
        "pinbench load: {}: a safetensors file of {} ({} bf16 tensors of {}, {} of header) at {}, {}",
        f.device,
        human(file.bytes),
        file.tensors,
        human(file.tensor_bytes as u64),
        size_label(file.data_start as usize),
        file.path,
        match file.write_seconds {
            Some(s) => format!(
                "written by this run ({:.2} GB/s, flushed to the disk)",
                file.bytes as f64 / s / 1e9
            ),
            None => "reused: kept by an earlier run".into(),
        }
    );
    let s = &file.storage;
    let unknown = || "?".to_owned();
    let disk = s.disk.as_ref().map_or_else(
        || "disk: not found (no block device under the file system)".to_owned(),
        |d| {
            format!(
                "disk {}: {}{}",
                d.name,
                match d.rotational {
                    Some(true) => "rotational",
                    Some(false) => "not rotational (SSD)",
                    None => "rotational or not: unknown",
                },
                d.model
                    .as_ref()
                    .map_or(String::new(), |m| format!(", model {m}"))
            )
        },
    );
    let _ = writeln!(
        out,
        "file system {} of {}, mounted at {}; {disk}",
        s.file_system.clone().unwrap_or_else(unknown),
        s.source.clone().unwrap_or_else(unknown),
        s.mount_point.clone().unwrap_or_else(unknown),
    );
    let d = &f.loader_defaults;
    let _ = writeln!(
        out,
        "loader defaults: {} readers, {} slots of {} ({} pinned at most), the pool's slots pinned before timing; \
         the ceiling reads with as many threads, each its own {} chunks, strided",
        d.readers,
        d.slots,
        size_label(d.slot_bytes),
        size_label(d.pinned_bytes),
        size_label(d.slot_bytes)
    );
    let _ = writeln!(
        out,
        "GB/s = 1e9 bytes/s over the wall time of one run, the data on the device at the end; resident = the file's \
         pages in the page cache just before (! where not cold, at most {:.0}%, or warm, at least {:.0}%); \
         /ceil = over the ceiling of the same state, /upload = over the pinned upload",
        COLD_AT_MOST * 100.0,
        WARM_AT_LEAST * 100.0
    );
    let _ = writeln!(
        out,
        "{:<38} | {:^33} | {:^33}",
        "", "cold: page cache emptied", "warm: file read just before"
    );
    let head = format!(
        "{:>9} {:>7} {:>6} {:>7}",
        "resident", "GB/s", "/ceil", "/upload"
    );
    let _ = writeln!(out, "{:<38} | {head} | {head}", "");
    let rows = |s: &State| s.figures().map(|(_, f)| f.clone());
    for ((name, cold), warm) in ROWS.iter().zip(rows(&f.cold)).zip(rows(&f.warm)) {
        let wrong = [&cold, &warm].iter().any(|f| f.verified == Some(false));
        let _ = writeln!(
            out,
            "{name:<38} | {} | {}{}",
            cells(&cold),
            cells(&warm),
            if wrong { "  ! wrong data" } else { "" }
        );
    }
    for state in [&f.cold, &f.warm] {
        let name = state.cache.name();
        let _ = writeln!(out, "{name} ceiling: {}", how(&state.ceiling));
        let _ = writeln!(out, "{name} Stream::load_file: {}", how(&state.load_file));
        let _ = writeln!(
            out,
            "{name} SafeTensorsFile::load: {}",
            how(&state.safetensors)
        );
    }
    let r = &f.references;
    let _ = writeln!(
        out,
        "references (medians of {}): a warm Vec of {} copied into pinned memory on {} threads {:.2} GB/s; a pinned \
         upload of {} {:.2} GB/s (CUDA events){}",
        r.samples,
        size_label(r.bytes),
        r.threads,
        r.host_copy_into_pinned_gb_per_s,
        size_label(r.bytes),
        r.pinned_upload_gb_per_s,
        if r.verified { "" } else { "  ! wrong data" }
    );
    let _ = writeln!(
        out,
        "goal, cold: Stream::load_file / ceiling = {}",
        judged(&f.cold_goal)
    );
    let _ = writeln!(
        out,
        "goal, warm: Stream::load_file / min(host copy into pinned, pinned upload) = {}",
        judged(&f.warm_goal)
    );
    let _ = writeln!(out, "checked: {}", f.checked);
    if let Some(points) = &f.sweep {
        for (cache, forced, counts, reads) in [
            (Cache::Cold, false, &SWEEP_READERS[..], "direct readers"),
            (
                Cache::Cold,
                true,
                &SWEEP_COLD_BUFFERED_READERS[..],
                "Io::Buffered",
            ),
            (
                Cache::Warm,
                false,
                &SWEEP_BUFFERED_READERS[..],
                "buffered readers",
            ),
        ] {
            let _ = writeln!(
                out,
                "sweep: {} Stream::load_file_with, {reads}, slots = readers + 1, GB/s (over the {} ceiling; \
                 * buffered reads, ! not {}, X wrong data)",
                cache.name(),
                cache.name(),
                cache.name()
            );
            let _ = write!(out, "{:>8}", "readers");
            for slot in SWEEP_SLOTS {
                let _ = write!(out, " {:>18}", format!("slots of {}", size_label(slot)));
            }
            out.push('\n');
            for &readers in counts {
                let _ = write!(out, "{readers:>8}");
                for slot in SWEEP_SLOTS {
                    let cell = points
                        .iter()
                        .find(|p| {
                            (p.cache, p.forced_buffered, p.readers, p.slot_bytes)
                                == (cache, forced, readers, slot)
                        })
                        .map_or("-".to_owned(), |p| {
                            let g = &p.figure;
                            format!(
                                "{:.2} ({:.2}){}{}{}",
                                g.gb_per_s,
                                g.ratio_to_ceiling,
                                if g.direct { "" } else { "*" },
                                if g.cache_state_reached { "" } else { "!" },
                                if g.verified == Some(false) { "X" } else { "" }
                            )
                        });
                    let _ = write!(out, " {cell:>18}");
                }
                out.push('\n');
            }
        }
    }
    let _ = writeln!(
        out,
        "file {} ({:.1} s in all)",
        if file.kept {
            "kept (--keep): a later run of the same size reuses it"
        } else {
            "removed"
        },
        f.wall_seconds
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::super::disk::{Disk, Storage};
    use super::super::{Cache, Defaults, FileInfo, Loader, References, SweepPoint};
    use super::*;

    fn figure(gb_per_s: f64, resident: f64, direct: bool, loader: bool) -> Figure {
        Figure {
            bytes: 8 << 30,
            seconds: (8u64 << 30) as f64 / gb_per_s / 1e9,
            gb_per_s,
            ratio_to_ceiling: gb_per_s / 6.0,
            ratio_to_pinned_upload: gb_per_s / 50.0,
            resident_before: resident,
            cache_state_reached: resident <= 0.05 || resident >= 0.95,
            direct,
            why_buffered: (!direct).then(|| "the page cache holds 100% of the bytes".into()),
            loader: loader.then_some(Loader {
                readers: 4,
                slot_bytes: 16 << 20,
                slots: 5,
                pinned_bytes: 80 << 20,
                read_bytes: 8 << 30,
                returned_seconds: 1.2,
            }),
            verified: Some(true),
        }
    }

    fn state(cache: Cache, resident: f64) -> State {
        let direct = cache == Cache::Cold;
        State {
            cache,
            ceiling: Figure {
                verified: None,
                ..figure(6.0, resident, direct, false)
            },
            load_file: figure(5.7, resident, direct, true),
            safetensors: figure(5.6, resident, direct, true),
            pageable: figure(2.1, resident, false, false),
            mmap: figure(1.9, resident, false, false),
        }
    }

    fn sample() -> Figures {
        Figures {
            device: "NVIDIA H100 PCIe".into(),
            quick: false,
            wall_seconds: 61.0,
            file: FileInfo {
                path: "/tmp/pinbench-load.safetensors".into(),
                bytes: (8 << 30) + 4096,
                data_start: 4096,
                data_bytes: 8 << 30,
                tensors: 32,
                tensor_bytes: 256 << 20,
                dtype: "BF16",
                written: true,
                write_seconds: Some(4.0),
                kept: false,
                storage: Storage {
                    mount_point: Some("/".into()),
                    file_system: Some("ext4".into()),
                    source: Some("/dev/nvme0n1p2".into()),
                    disk: Some(Disk {
                        name: "nvme0n1".into(),
                        rotational: Some(false),
                        model: Some("Some NVMe".into()),
                    }),
                },
            },
            loader_defaults: Defaults {
                readers: 4,
                buffered_readers: 4,
                slot_bytes: 16 << 20,
                slots: 5,
                pinned_bytes: 80 << 20,
            },
            pool_budget_bytes: 640 << 20,
            references: References {
                bytes: 1 << 30,
                threads: 16,
                samples: 5,
                host_copy_into_pinned_gb_per_s: 30.0,
                host_copy_into_pinned_seconds: 0.036,
                pinned_upload_gb_per_s: 50.0,
                pinned_upload_seconds: 0.021,
                verified: true,
            },
            cold: state(Cache::Cold, 0.0),
            // The warm ceiling not warm: its goal is not judged.
            warm: state(Cache::Warm, 0.5),
            cold_goal: Goal {
                ratio: 0.95,
                goal: 0.9,
                met: Some(true),
                note: None,
            },
            warm_goal: Goal {
                ratio: 0.19,
                goal: 0.85,
                met: None,
                note: Some("not judged: not warm".into()),
            },
            checked: "64 pieces".into(),
            sweep: Some(vec![SweepPoint {
                cache: Cache::Cold,
                forced_buffered: false,
                readers: 2,
                slot_bytes: 64 << 20,
                figure: Figure {
                    verified: Some(false),
                    ..figure(4.0, 0.0, true, true)
                },
            }]),
        }
    }

    #[test]
    fn the_table_shows_every_figure_its_state_and_the_goals() {
        let text = table(&sample());
        for needle in [
            "ceiling: reads alone",
            "Stream::load_file",
            "SafeTensorsFile::open + load",
            "mmap + upload_pageable",
            "file system ext4 of /dev/nvme0n1p2, mounted at /; disk nvme0n1: not rotational (SSD), model Some NVMe",
            "cold Stream::load_file: direct reads (O_DIRECT); 4 readers, 5 slots of 16 MiB (80 MiB pinned)",
            "goal, cold: Stream::load_file / ceiling = 0.95 (goal >= 0.90: met)",
            "min(host copy into pinned, pinned upload) = 0.19 (goal >= 0.85; not judged",
            "   50.0%! ",
            "4.00 (0.67)X",
            "file removed",
        ] {
            assert!(text.contains(needle), "{needle:?} in\n{text}");
        }
        // A sweep point not measured is a dash.
        assert!(text.contains("                 -"), "{text}");
    }

    #[test]
    fn the_document_has_the_figures_their_units_and_the_failures() {
        let figures = sample();
        let doc: Value =
            serde_json::from_str(&crate::json::pretty(&document(&figures, true)).unwrap()).unwrap();
        assert_eq!(doc["mode"], "load");
        assert_eq!(doc["simulated_driver"], true);
        assert!(doc["units"]["gb_per_s"].is_string());
        assert_eq!(doc["cold"]["cache"], "cold");
        assert_eq!(doc["cold"]["load_file"]["loader"]["pinned_bytes"], 80 << 20);
        assert_eq!(doc["cold"]["ceiling"]["verified"], Value::Null);
        assert_eq!(doc["warm"]["mmap"]["direct"], false);
        assert_eq!(doc["warm_goal"]["met"], Value::Null);
        assert_eq!(doc["file"]["storage"]["disk"]["rotational"], false);
        assert_eq!(doc["sweep"][0]["readers"], 2);
        assert_eq!(doc["sweep"][0]["gb_per_s"], 4.0);
        assert_eq!(
            doc["failures"],
            serde_json::json!(["the sweep's load of 2 readers x 64 MiB"])
        );
        let plain: Value =
            serde_json::from_str(&crate::json::pretty(&document(&figures, false)).unwrap())
                .unwrap();
        assert!(plain.get("simulated_driver").is_none());
    }
}
