//! The prefetched gathers' figures and their report, on made-up runs, and the rows the run picks.

use serde_json::{Value, json};

use super::super::prefetch::row_of;
use super::{close, keys, round_trip, sample};
use crate::devices::table;

#[test]
fn prefetched_gathers_count_every_devices_batches_and_compare_with_device_0_alone() {
    let f = sample(2);
    let g = &f.prefetched_gathers;
    assert!(close(g.one_device_gb_per_s().unwrap(), 48.0));
    assert!(close(g.all_devices_gb_per_s().unwrap(), 94.0));
    assert!(close(g.ratio_to_one_device().unwrap(), 94.0 / 48.0));
    let text = table(&f);
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("prefetched gathers:"))
        .collect();
    assert!(
        lines[0].contains("16 KiB rows at random indices from one 4 GiB table")
            && lines[0].contains("(NUMA node 0)")
            && lines[0].contains("128 batches of 32 MiB per device")
            && lines[0].ends_with("(median of 5 rounds):"),
        "{text}"
    );
    assert_eq!(lines[1], "  device 0 alone:   48.0");
    assert_eq!(lines[2], "  all 2 devices:    94.0 (1.96x device 0 alone)");
    let v = round_trip(&f);
    let p = &v["prefetched_gathers"];
    assert_eq!(
        keys(p),
        [
            "all_devices_gb_per_s",
            "all_devices_seconds",
            "batches_per_device",
            "bytes_per_batch",
            "devices",
            "error",
            "one_device_gb_per_s",
            "one_device_seconds",
            "ratio_to_one_device",
            "rounds",
            "row_bytes",
            "table_bytes",
            "table_numa_node",
            "verified"
        ]
    );
    assert_eq!(p["devices"], json!([0, 1]));
    assert_eq!(p["bytes_per_batch"], 32 << 20);
    assert_eq!(p["row_bytes"], 16 << 10);
    assert_eq!(p["batches_per_device"], 128);
    assert_eq!(p["table_numa_node"], 0);
    assert!(close(p["one_device_gb_per_s"].as_f64().unwrap(), 48.0));
    assert!(close(p["all_devices_gb_per_s"].as_f64().unwrap(), 94.0));
    assert!(close(
        p["ratio_to_one_device"].as_f64().unwrap(),
        94.0 / 48.0
    ));
    assert_eq!(p["verified"], true);
    assert_eq!(p["error"], Value::Null);
}

#[test]
fn prefetched_gathers_not_measured_say_why_and_fail_nothing() {
    let mut f = sample(2);
    let why = "device 1's gather kernels: CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    f.prefetched_gathers.result = Err(why.to_string());
    f.prefetched_gathers.table_numa_node = None;
    let g = &f.prefetched_gathers;
    assert_eq!(
        (
            g.one_device_gb_per_s(),
            g.all_devices_gb_per_s(),
            g.ratio_to_one_device()
        ),
        (None, None, None)
    );
    assert!(f.failures().is_empty() && f.errors().is_empty());
    let text = table(&f);
    assert!(text.contains("(NUMA node -)"), "{text}");
    assert!(
        text.contains(&format!("end:\n  not measured: {why}\n")),
        "{text}"
    );
    let v = round_trip(&f);
    let p = &v["prefetched_gathers"];
    for key in [
        "one_device_gb_per_s",
        "all_devices_gb_per_s",
        "ratio_to_one_device",
        "rounds",
        "verified",
        "table_numa_node",
    ] {
        assert_eq!(p[key], Value::Null, "{key}");
    }
    assert_eq!(p["error"], why);
    assert_eq!(p["devices"], json!([0, 1]));
}

#[test]
fn gathered_rows_are_deterministic_spread_and_in_the_table() {
    let rows = 65536;
    let batch: Vec<u32> = (0..2048).map(|k| row_of(7, 3, k, rows)).collect();
    assert_eq!(
        batch,
        (0..2048).map(|k| row_of(7, 3, k, rows)).collect::<Vec<_>>()
    );
    assert!(batch.iter().all(|&r| (r as usize) < rows));
    // Other batches, other passes: other rows.
    assert_ne!(
        batch[..8],
        (0..8).map(|k| row_of(7, 4, k, rows)).collect::<Vec<_>>()
    );
    assert_ne!(
        batch[..8],
        (0..8).map(|k| row_of(8, 3, k, rows)).collect::<Vec<_>>()
    );
    // At random: about as many distinct rows as a uniform draw gives (2048 of 65536: ~2016).
    let mut distinct = batch.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 1990, "{}", distinct.len());
    let mut halves = [0usize; 2];
    for &r in &batch {
        halves[usize::from(r as usize >= rows / 2)] += 1;
    }
    assert!(halves.iter().all(|&h| h > 900), "{halves:?}");
    // A table of one row, and the largest one the kernel's u32 indices reach.
    assert_eq!(row_of(1, 2, 3, 1), 0);
    assert!((0..64).all(|k| (row_of(1, 2, k, 1 << 32) as u64) < 1 << 32));
}
