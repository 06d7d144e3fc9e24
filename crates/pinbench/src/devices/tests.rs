//! The figures' arithmetic and their report, on made-up runs: measuring needs devices, which the simulator's
//! runs of `pinbench devices` stand in for.

use serde_json::{Value, json};

use super::measure::{parse_numa_node, round_spans, sysfs_bus_id};
use super::prefetch::{BATCH_BYTES, ROW_BYTES};
use super::report::UNITS;
use super::*;
use crate::timing::Timed;

mod gathers;

/// A made-up figure of `gbps` GB/s over copies of `bytes`.
fn figure(bytes: usize, gbps: f64) -> Figure {
    Figure {
        bytes,
        timed: Timed {
            seconds: bytes as f64 / (gbps * 1e9),
            samples: 7,
            batch: 1,
        },
        verified: true,
    }
}

/// Made-up uploads of `devices` at `gbps` GB/s all together.
fn together_at(devices: &[usize], gbps: f64) -> Together {
    let bytes = FULL_BYTES;
    Together {
        devices: devices.to_vec(),
        bytes,
        copies_per_round: 1,
        seconds: (devices.len() * bytes) as f64 / (gbps * 1e9),
        rounds: 11,
        verified: true,
    }
}

/// Made-up prefetched gathers on `n` devices: 128 batches of 32 MiB per device, device 0 alone at 48 GB/s,
/// every device at 47 GB/s each.
fn gathers(n: usize) -> PrefetchedGathers {
    let per_device = 128 * BATCH_BYTES;
    PrefetchedGathers {
        devices: (0..n).collect(),
        table_bytes: 4 << 30,
        table_numa_node: Some(0),
        row_bytes: ROW_BYTES,
        bytes_per_batch: BATCH_BYTES,
        batches_per_device: 128,
        result: Ok(Fed {
            one_device_seconds: per_device as f64 / 48e9,
            all_devices_seconds: if n == 1 {
                per_device as f64 / 48e9
            } else {
                per_device as f64 / 47e9
            },
            rounds: 5,
            verified: true,
        }),
    }
}

/// A made-up run on `n` devices: each alone 50 GB/s up and 40 down, 49 timed on the host, all together 49
/// per device (shared: 45), local copies 2000 GB/s, peer copies (direct) 100 + 10 * src + dst GB/s; the
/// prefetched gathers of [`gathers`].
fn sample(n: usize) -> Figures {
    let bytes = FULL_BYTES;
    let ordinals: Vec<usize> = (0..n).collect();
    let mut peer = Vec::new();
    for src in 0..n {
        for dst in 0..n {
            let gbps = if src == dst {
                2000.0
            } else {
                100.0 + 10.0 * src as f64 + dst as f64
            };
            peer.push(PeerCopy {
                src,
                dst,
                peer_access: (src != dst).then_some(true),
                route: (src != dst).then_some(Route::Direct),
                result: Ok(figure(bytes, gbps)),
            });
        }
    }
    let first_alone = together_at(&[0], 49.0);
    Figures {
        quick: false,
        bytes,
        nvidia_driver: Some("580.159.04".to_string()),
        cuda_version: 13000,
        driver_library: "libcuda.so.1".to_string(),
        devices: ordinals
            .iter()
            .map(|&ordinal| DeviceFigures {
                ordinal,
                name: "NVIDIA H200".to_string(),
                pci_bus_id: format!("0000:{:02X}:00.0", 0x18 + 0x20 * ordinal),
                numa_node: Some(u32::from(ordinal >= 4)),
                pinned_numa_node: Some(u32::from(ordinal >= 4)),
                pcie: Some(Link {
                    generation: 5,
                    width: 16,
                    max_generation: 5,
                    max_width: 16,
                }),
                upload: figure(bytes, 50.0),
                download: figure(bytes, 40.0),
            })
            .collect(),
        host_to_all: if n == 1 {
            first_alone.clone()
        } else {
            together_at(&ordinals, 49.0 * n as f64)
        },
        shared_to_all: together_at(&ordinals, 45.0 * n as f64),
        first_alone,
        peer,
        prefetched_gathers: gathers(n),
        wall_seconds: 30.0,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[test]
fn full_and_quick_copy_sizes_and_rounds() {
    let full = Settings::new(false);
    assert_eq!(full.bytes, 256 << 20);
    assert_eq!(full.copies_per_round(), 1);
    assert!(!full.plan.quick && full.rounds > full.warmup);
    let quick = Settings::new(true);
    assert_eq!(quick.bytes, 64 << 20);
    // A round moves 256 MiB per device either way.
    assert_eq!(quick.copies_per_round() * quick.bytes, 256 << 20);
    assert!(quick.plan.quick && quick.rounds < full.rounds);
    // The prefetched gathers: 4 GiB and 1 GiB tables, each batch 32 MiB of 16 KiB rows.
    assert_eq!((full.table_bytes, quick.table_bytes), (4 << 30, 1 << 30));
    assert_eq!((BATCH_BYTES, ROW_BYTES), (32 << 20, 16 << 10));
    assert!(
        quick.gather_batches < full.gather_batches && quick.gather_rounds <= full.gather_rounds
    );
    assert!(quick.gather_rounds > 0 && quick.gather_batches > 0);
}

#[test]
fn a_round_spans_the_earliest_start_to_the_latest_end() {
    let per_thread = vec![
        vec![(0.0, 9.0), (10.0, 12.0), (20.0, 25.0)],
        vec![(0.5, 1.0), (10.5, 14.0), (20.1, 21.0)],
        vec![(0.2, 2.0), (9.5, 13.0), (20.3, 24.0)],
    ];
    assert_eq!(round_spans(&per_thread, 0), vec![9.0, 4.5, 5.0]);
    // Warm-up rounds are left out.
    assert_eq!(round_spans(&per_thread, 1), vec![4.5, 5.0]);
    assert_eq!(round_spans(&per_thread, 3), Vec::<f64>::new());
    // One thread alone: its own spans.
    assert_eq!(round_spans(&per_thread[..1], 0), vec![9.0, 2.0, 5.0]);
    // Rounds that a thread lacks are not counted.
    let short = vec![vec![(0.0, 1.0), (2.0, 3.0)], vec![(0.0, 2.0)]];
    assert_eq!(round_spans(&short, 0), vec![2.0]);
    assert!(round_spans(&[], 0).is_empty());
}

#[test]
fn aggregates_count_every_devices_bytes_and_compare_with_device_0_alone() {
    let f = sample(2);
    assert!(close(f.first_alone.gb_per_s(), 49.0));
    assert!(close(f.host_to_all.gb_per_s(), 98.0));
    assert!(close(f.ratio_to_first(&f.host_to_all), 2.0));
    assert!(close(f.ratio_to_first(&f.shared_to_all), 90.0 / 49.0));
    assert!(close(f.sum_alone(), 100.0));
    // Several copies per round count as many times their bytes.
    let mut t = together_at(&[0, 1, 2], 30.0);
    let seconds = t.seconds;
    t.copies_per_round = 4;
    t.bytes /= 4;
    assert!(close(t.seconds, seconds) && close(t.gb_per_s(), 30.0));
}

#[test]
fn one_device_is_all_devices_and_a_matrix_of_one() {
    let f = sample(1);
    assert_eq!(f.host_to_all, f.first_alone);
    assert!(close(f.ratio_to_first(&f.host_to_all), 1.0));
    assert_eq!(f.matrix(), vec![vec![Some(2000.0)]]);
    let text = table(&f);
    assert!(text.contains("1 CUDA device,"), "{text}");
    assert!(text.contains("(1.00x device 0 alone"), "{text}");
    let v = round_trip(&f);
    assert_eq!(v["peer"]["matrix_gb_per_s"], json!([[2000.0]]));
    assert_eq!(v["peer"]["copies"][0]["kind"], "local");
    assert_eq!(v["peer"]["copies"][0]["peer_access"], Value::Null);
    assert_eq!(v["peer"]["copies"][0]["route"], Value::Null);
    assert_eq!(v["host_to_all"]["ratio_to_first_device"], 1.0);
    // Every device is device 0: the same figure, a ratio of exactly 1.
    assert_eq!(f.prefetched_gathers.ratio_to_one_device(), Some(1.0));
    assert!(
        text.contains("  all 1 device:     48.0 (1.00x device 0 alone)"),
        "{text}"
    );
    assert_eq!(v["prefetched_gathers"]["devices"], json!([0]));
    assert_eq!(v["prefetched_gathers"]["ratio_to_one_device"], 1.0);
}

#[test]
fn the_matrix_is_by_source_then_destination() {
    let f = sample(3);
    let m = f.matrix();
    assert_eq!(m.len(), 3);
    for (src, row) in m.iter().enumerate() {
        for (dst, cell) in row.iter().enumerate() {
            let want = if src == dst {
                2000.0
            } else {
                100.0 + 10.0 * src as f64 + dst as f64
            };
            assert!(close(cell.unwrap(), want), "[{src}][{dst}]");
        }
    }
    let text = table(&f);
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("  src\\dst"))
        .collect();
    assert_eq!(
        rows[0].split_whitespace().collect::<Vec<_>>(),
        ["src\\dst", "0", "1", "2"],
        "{text}"
    );
    assert_eq!(
        rows[2].split_whitespace().collect::<Vec<_>>(),
        ["1", "110.0", "2000.0", "112.0"],
        "{text}"
    );
}

#[test]
fn staged_copies_are_marked_and_direct_ones_not() {
    let mut f = sample(3);
    for cell in f
        .peer
        .iter_mut()
        .filter(|c| (c.src, c.dst) == (1, 2) || (c.src, c.dst) == (2, 1))
    {
        cell.peer_access = Some(false);
        cell.route = Some(Route::Staged);
    }
    let text = table(&f);
    let row = |src: &str| -> Vec<&str> {
        text.lines()
            .skip_while(|l| !l.starts_with("  src\\dst"))
            .find(|l| l.split_whitespace().next() == Some(src))
            .unwrap_or_else(|| panic!("no row {src} in\n{text}"))
            .split_whitespace()
            .collect()
    };
    assert_eq!(row("1"), ["1", "110.0", "2000.0", "*112.0"], "{text}");
    assert_eq!(row("2"), ["2", "120.0", "*121.0", "2000.0"], "{text}");
    assert!(text.contains("* staged through pinned memory"), "{text}");
    assert!(f.errors().is_empty() && f.failures().is_empty());
    let v = round_trip(&f);
    let copies = v["peer"]["copies"].as_array().unwrap();
    let cell = |src: usize, dst: usize| &copies[3 * src + dst];
    assert_eq!(
        (cell(0, 1)["src"].clone(), cell(0, 1)["dst"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(cell(0, 1)["route"], "direct");
    assert_eq!(cell(0, 1)["peer_access"], true);
    assert_eq!(cell(1, 2)["route"], "staged");
    assert_eq!(cell(1, 2)["peer_access"], false);
    assert_eq!(cell(2, 1)["route"], "staged");
    assert_eq!(cell(2, 2)["route"], Value::Null);
    // A staged copy is a figure like any other.
    assert!(close(cell(1, 2)["gb_per_s"].as_f64().unwrap(), 112.0));
    assert_eq!(cell(1, 2)["error"], Value::Null);
}

#[test]
fn a_failed_copy_is_an_error_in_its_cell_not_a_figure() {
    let mut f = sample(2);
    // Enabling peer access failed: the copies were not tried, and which way they would have gone is unknown.
    let error = "enabling device 0's access to device 1's memory: CUDA_ERROR_TOO_MANY_PEERS";
    f.peer[1].route = None;
    f.peer[1].result = Err(error.to_string());
    f.peer[2].peer_access = Some(false);
    f.peer[2].route = Some(Route::Staged);
    assert_eq!(f.matrix()[0][1], None);
    assert_eq!(
        f.errors(),
        [format!("copy from device 0 to device 1: {error}")]
    );
    assert!(f.failures().is_empty());
    let text = table(&f);
    let row0: Vec<&str> = text
        .lines()
        .find(|l| l.trim_start().starts_with("0 ") && l.contains("error"))
        .unwrap_or_else(|| panic!("no row 0 with an error in\n{text}"))
        .split_whitespace()
        .collect();
    assert_eq!(row0, ["0", "2000.0", "error"]);
    assert!(text.contains("*110.0"), "{text}");
    assert!(
        text.contains(&format!(
            "copies that failed:\n  copy from device 0 to device 1: {error}"
        )),
        "{text}"
    );
    let v = round_trip(&f);
    let cell = &v["peer"]["copies"][1];
    assert_eq!(cell["gb_per_s"], Value::Null);
    assert_eq!(cell["verified"], Value::Null);
    assert_eq!(cell["route"], Value::Null);
    assert_eq!(cell["peer_access"], true);
    assert_eq!(cell["error"], error);
    assert_eq!(v["peer"]["matrix_gb_per_s"][0][1], Value::Null);
    assert_eq!(v["errors"].as_array().unwrap().len(), 1);
}

#[test]
fn failed_data_checks_are_marked_and_listed() {
    let mut f = sample(2);
    f.devices[1].download.verified = false;
    f.shared_to_all.verified = false;
    if let Ok(figure) = &mut f.peer[2].result {
        figure.verified = false;
    }
    if let Ok(fed) = &mut f.prefetched_gathers.result {
        fed.verified = false;
    }
    assert_eq!(
        f.failures(),
        [
            "download from device 1",
            "one shared buffer to all devices",
            "copy from device 1 to device 0",
            "prefetched gathers"
        ]
    );
    let text = table(&f);
    assert!(text.contains("40.0 !"), "{text}");
    assert!(text.contains("  device 0 alone:   48.0 !\n"), "{text}");
    assert!(text.contains("DATA CHECK FAILED"), "{text}");
    let v = round_trip(&f);
    assert_eq!(v["devices"][1]["verified"], false);
    assert_eq!(v["shared_to_all"]["verified"], false);
    assert_eq!(v["prefetched_gathers"]["verified"], false);
    assert_eq!(v["failures"].as_array().unwrap().len(), 4);
}

#[test]
fn the_header_names_every_device_and_where_it_sits() {
    let mut f = sample(5);
    f.devices[1].pcie = None;
    f.devices[1].numa_node = None;
    f.devices[1].pinned_numa_node = None;
    // A node sysfs gives, where the library binds none (a host of one node): each column says its own.
    f.devices[2].pinned_numa_node = None;
    let text = table(&f);
    let row = |ordinal: &str| -> Vec<&str> {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(ordinal) && l.contains("0000:"))
            .unwrap_or_else(|| panic!("no device row {ordinal} in\n{text}"))
            .split_whitespace()
            .collect()
    };
    // ordinal, 2 words of name, PCI, NUMA, pinned.
    assert_eq!(row("1")[4..6], ["-", "-"], "{text}");
    assert_eq!(row("2")[4..6], ["0", "-"], "{text}");
    assert_eq!(row("4")[4..6], ["1", "1"], "{text}");
    assert!(text.contains(" NUMA pinned "), "{text}");
    assert!(
        text.contains("NVIDIA 580.159.04, supports CUDA 13.0"),
        "{text}"
    );
    assert!(text.contains("0000:18:00.0"), "{text}");
    assert!(text.contains("gen 5 x16 (gen 5 x16)"), "{text}");
    assert!(text.contains("unknown (no NVML)"), "{text}");
    let v = round_trip(&f);
    assert_eq!(v["header"]["device_count"], 5);
    assert_eq!(v["header"]["cuda_version"], "13.0");
    assert_eq!(v["devices"][0]["numa_node"], 0);
    assert_eq!(v["devices"][1]["numa_node"], Value::Null);
    assert_eq!(v["devices"][2]["numa_node"], 0);
    assert_eq!(v["devices"][2]["pinned_numa_node"], Value::Null);
    assert_eq!(v["devices"][4]["pinned_numa_node"], 1);
    assert_eq!(v["devices"][1]["pcie"], Value::Null);
    assert_eq!(
        v["devices"][0]["pcie"],
        json!({"generation": 5, "width": 16, "max_generation": 5, "max_width": 16})
    );
}

#[test]
fn bus_ids_become_sysfs_names() {
    assert_eq!(sysfs_bus_id("0000:65:00.0"), "0000:65:00.0");
    assert_eq!(sysfs_bus_id("0000:3B:00.0"), "0000:3b:00.0");
    assert_eq!(sysfs_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
    assert_eq!(sysfs_bus_id("0001:C1:00.0\n"), "0001:c1:00.0");
    // A domain wider than 4 digits (Intel VMD) keeps its digits.
    assert_eq!(sysfs_bus_id("10000:E1:00.0"), "10000:e1:00.0");
    assert_eq!(sysfs_bus_id("garbage"), "garbage");
}

#[test]
fn numa_nodes_of_minus_one_or_nonsense_are_none() {
    assert_eq!(parse_numa_node("0\n"), Some(0));
    assert_eq!(parse_numa_node("3"), Some(3));
    assert_eq!(parse_numa_node("-1\n"), None);
    assert_eq!(parse_numa_node(""), None);
    assert_eq!(parse_numa_node("node0"), None);
}

/// The document of `f`, printed and parsed back.
fn round_trip(f: &Figures) -> Value {
    let text = crate::json::pretty(&document(f)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The keys of an object, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut keys: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    keys.sort_unstable();
    keys
}

#[test]
fn the_document_has_every_figure_with_its_ratios() {
    let f = sample(2);
    let v = round_trip(&f);
    assert_eq!(
        keys(&v),
        [
            "bytes",
            "devices",
            "errors",
            "failures",
            "header",
            "host_to_all",
            "library",
            "mode",
            "peer",
            "prefetched_gathers",
            "quick",
            "shared_to_all",
            "tool",
            "units",
            "version",
            "wall_seconds"
        ]
    );
    assert_eq!(v["mode"], "devices");
    assert_eq!(v["library"], "cuda-pinned");
    assert_eq!(v["bytes"], 256 << 20);
    let d = &v["devices"][1];
    assert_eq!(d["ordinal"], 1);
    assert_eq!(d["pci_bus_id"], "0000:38:00.0");
    assert!(close(d["upload_gb_per_s"].as_f64().unwrap(), 50.0));
    assert!(close(d["download_gb_per_s"].as_f64().unwrap(), 40.0));
    assert_eq!(d["samples"], 7);
    let all = &v["host_to_all"];
    assert_eq!(all["devices"], json!([0, 1]));
    assert_eq!(all["bytes_per_device"], 256 << 20);
    assert!(close(all["aggregate_gb_per_s"].as_f64().unwrap(), 98.0));
    assert!(close(
        all["first_device_alone_gb_per_s"].as_f64().unwrap(),
        49.0
    ));
    assert!(close(all["ratio_to_first_device"].as_f64().unwrap(), 2.0));
    assert!(close(all["sum_alone_gb_per_s"].as_f64().unwrap(), 100.0));
    assert!(close(all["ratio_to_sum_alone"].as_f64().unwrap(), 0.98));
    assert!(close(
        v["shared_to_all"]["aggregate_gb_per_s"].as_f64().unwrap(),
        90.0
    ));
    let copies = v["peer"]["copies"].as_array().unwrap();
    assert_eq!(copies.len(), 4);
    assert_eq!(copies[1]["src"], 0);
    assert_eq!(copies[1]["dst"], 1);
    assert_eq!(copies[1]["kind"], "peer");
    assert_eq!(copies[1]["peer_access"], true);
    assert_eq!(copies[1]["route"], "direct");
    assert!(close(copies[1]["gb_per_s"].as_f64().unwrap(), 101.0));
    assert_eq!(copies[1]["error"], Value::Null);
    assert_eq!(v["errors"], json!([]));
    assert_eq!(
        keys(&v["units"]),
        keys(&serde_json::to_value(UNITS).unwrap())
    );
}

/// Every key of the document, at every depth (the first element of arrays stands for all).
fn all_keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                out.push(key.clone());
                all_keys(value, out);
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                all_keys(first, out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_pytorch_script_writes_the_same_keys() {
    let script = include_str!("../../../../scripts/torch-devices.py");
    let mut document = round_trip(&sample(2));
    // The prefetched gathers have no PyTorch twin (the prefetcher of rows gathered on the device is the
    // crate's): the script writes the key, as null, and none of the figures inside.
    assert!(
        script.contains("\"prefetched_gathers\": None,"),
        "scripts/torch-devices.py does not write prefetched_gathers as null"
    );
    document["prefetched_gathers"] = Value::Null;
    let mut keys = Vec::new();
    all_keys(&document, &mut keys);
    assert!(keys.iter().any(|k| k == "prefetched_gathers"));
    for key in keys {
        assert!(
            script.contains(&format!("\"{key}\"")),
            "scripts/torch-devices.py never writes the key {key:?}"
        );
    }
}
