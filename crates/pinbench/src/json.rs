//! `--json`: the whole report as one JSON document, written by hand (a value type and a printer), so that the
//! library's build carries no serialisation dependency. Keys name their units (`seconds`, `gb_per_s`, `bytes`);
//! `units` at the top spells them out.

use std::fmt::Write;

use crate::results::{Bandwidth, Report, StagingSweep, gb_per_s};

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number; NaN and infinities print as `null`, which JSON cannot express otherwise.
    Num(f64),
    /// An integer, printed exactly.
    Int(u64),
    /// A string, escaped when printed.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, keys in the given order.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// An object from `(key, value)` pairs.
    pub fn obj<const N: usize>(pairs: [(&str, Json); N]) -> Json {
        Json::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// A string value.
    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// A size or count.
    pub fn int(n: usize) -> Json {
        Json::Int(n as u64)
    }

    /// The value as pretty-printed JSON (two-space indent), ending in a newline.
    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            // Rust prints finite floats without exponents, which is valid JSON.
            Json::Num(x) if x.is_finite() => {
                let _ = write!(out, "{x}");
            }
            Json::Num(_) => out.push_str("null"),
            Json::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Json::Str(s) => escape(s, out),
            Json::Arr(items) if items.is_empty() => out.push_str("[]"),
            Json::Obj(fields) if fields.is_empty() => out.push_str("{}"),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    item.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    indent(out, depth + 1);
                    escape(key, out);
                    out.push_str(": ");
                    value.write(out, depth + 1);
                }
                out.push('\n');
                indent(out, depth);
                out.push('}');
            }
        }
    }
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

/// Writes `s` as a JSON string literal: quotes, backslashes and control characters escaped, the rest as is.
pub fn escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn opt<T>(value: Option<T>, f: impl FnOnce(T) -> Json) -> Json {
    value.map_or(Json::Null, f)
}

/// `--staging-sweep`'s figures: the pageable reference each way, and one entry per direction, chunk size and
/// thread count.
fn staging_sweep(sweep: &StagingSweep) -> Json {
    let figure = |b: &Bandwidth| {
        [
            ("direction", Json::str(b.direction.key())),
            ("gb_per_s", Json::Num(b.gb_per_s())),
            ("seconds", Json::Num(b.seconds)),
            ("samples", Json::int(b.samples)),
            ("batch", Json::int(b.batch)),
            ("verified", Json::Bool(b.verified)),
        ]
    };
    let pageable = sweep
        .pageable
        .iter()
        .map(|b| Json::obj(figure(b)))
        .collect();
    let points = sweep
        .points
        .iter()
        .map(|p| {
            let mut fields = vec![
                ("chunk_bytes".to_string(), Json::int(p.chunk_bytes)),
                ("threads".to_string(), Json::int(p.threads)),
            ];
            fields.extend(figure(&p.figure).map(|(k, v)| (k.to_string(), v)));
            fields.push((
                "ratio_to_pageable".to_string(),
                opt(sweep.ratio_to_pageable(p), Json::Num),
            ));
            Json::Obj(fields)
        })
        .collect();
    Json::obj([
        ("bytes", Json::int(sweep.bytes)),
        ("pool_budget_bytes", Json::int(sweep.pool_budget)),
        (
            "default",
            Json::obj([
                ("chunk_bytes", Json::int(sweep.default_chunk_bytes)),
                ("threads", Json::int(sweep.default_threads)),
            ]),
        ),
        ("pageable", Json::Arr(pageable)),
        ("points", Json::Arr(points)),
    ])
}

/// The report as a JSON value: `pinbench --json` prints `document(report).pretty()`.
pub fn document(report: &Report, plot: Option<&str>) -> Json {
    let h = &report.header;
    let d = &h.device;
    let header = Json::obj([
        (
            "device",
            Json::obj([
                ("ordinal", Json::int(d.ordinal)),
                ("name", Json::str(&d.name)),
                (
                    "compute_capability",
                    Json::str(format!(
                        "{}.{}",
                        d.compute_capability.0, d.compute_capability.1
                    )),
                ),
                ("memory_bytes", Json::int(d.memory_bytes)),
                ("pci_bus_id", Json::str(&d.pci_bus_id)),
                ("copy_engines", Json::Int(d.copy_engines.into())),
            ]),
        ),
        ("device_count", Json::int(h.device_count)),
        ("nvidia_driver", opt(h.nvidia_driver.as_ref(), Json::str)),
        ("cuda_version", Json::str(h.cuda_version_text())),
        ("driver_library", Json::str(&h.driver_library)),
        (
            "pcie",
            opt(h.pcie, |l| {
                Json::obj([
                    ("generation", Json::Int(l.generation.into())),
                    ("width", Json::Int(l.width.into())),
                    ("max_generation", Json::Int(l.max_generation.into())),
                    ("max_width", Json::Int(l.max_width.into())),
                    ("read", Json::str("under load")),
                ])
            }),
        ),
    ]);
    let bandwidth = report
        .bandwidth
        .iter()
        .map(|b| {
            Json::obj([
                ("method", Json::str(b.method.key())),
                ("api", Json::str(b.api.key())),
                ("direction", Json::str(b.direction.key())),
                ("bytes", Json::int(b.bytes)),
                ("gb_per_s", Json::Num(b.gb_per_s())),
                ("seconds", Json::Num(b.seconds)),
                ("ratio_to_raw", opt(report.ratio_to_raw(b), Json::Num)),
                (
                    "ratio_to_pageable",
                    opt(report.ratio_to_pageable(b), Json::Num),
                ),
                ("samples", Json::int(b.samples)),
                ("batch", Json::int(b.batch)),
                ("verified", Json::Bool(b.verified)),
            ])
        })
        .collect();
    let bidirectional = report
        .bidirectional
        .iter()
        .map(|b| {
            Json::obj([
                ("bytes", Json::int(b.bytes)),
                ("aggregate_gb_per_s", Json::Num(b.aggregate_gb_per_s())),
                ("both_seconds", Json::Num(b.both_seconds)),
                (
                    "upload_alone_gb_per_s",
                    Json::Num(gb_per_s(b.bytes, b.upload_seconds)),
                ),
                (
                    "download_alone_gb_per_s",
                    Json::Num(gb_per_s(b.bytes, b.download_seconds)),
                ),
                ("ratio_to_sum_alone", Json::Num(b.ratio_to_sum())),
                ("samples", Json::int(b.samples)),
                ("verified", Json::Bool(b.verified)),
            ])
        })
        .collect();
    let allocation = report
        .allocation
        .iter()
        .map(|a| {
            let speedup = report.alloc_speedup(a);
            Json::obj([
                ("what", Json::str(a.what.key())),
                ("bytes", Json::int(a.bytes)),
                ("seconds", Json::Num(a.seconds)),
                ("seconds_per_gib", Json::Num(a.seconds_per_gib())),
                ("samples", Json::int(a.samples)),
                ("batch", Json::int(a.batch)),
                ("speedup_over", opt(speedup, |(r, _)| Json::str(r.key()))),
                ("speedup", opt(speedup, |(_, x)| Json::Num(x))),
            ])
        })
        .collect();
    let e = &report.enqueue;
    let enqueue = Json::obj([
        ("bytes", Json::int(e.bytes)),
        ("raw_seconds", Json::Num(e.raw)),
        ("same_stream_seconds", Json::Num(e.same_stream)),
        ("cross_stream_seconds", Json::Num(e.cross_stream)),
        ("raw_cross_stream_seconds", Json::Num(e.raw_cross_stream)),
        ("same_stream_ratio_to_raw", Json::Num(e.same_stream / e.raw)),
        (
            "cross_stream_ratio_to_raw",
            Json::Num(e.cross_stream / e.raw),
        ),
        ("batch", Json::int(e.batch)),
        ("samples", Json::int(e.samples)),
    ]);
    let overlap = match &report.overlap {
        None => Json::obj([
            ("built", Json::Bool(false)),
            ("note", Json::str("build with --features gpu")),
        ]),
        Some(o) => Json::obj([
            ("built", Json::Bool(true)),
            ("chunks", Json::int(o.chunks)),
            ("chunk_bytes", Json::int(o.chunk_bytes)),
            ("spin_seconds", Json::Num(o.spin_seconds)),
            ("copy_seconds", Json::Num(o.copy_seconds)),
            ("kernel_seconds", Json::Num(o.kernel_seconds)),
            ("ideal_seconds", Json::Num(o.ideal_seconds())),
            ("one_stream_seconds", Json::Num(o.one_stream_seconds)),
            ("two_streams_seconds", Json::Num(o.two_streams_seconds)),
            (
                "one_stream_ratio_to_ideal",
                Json::Num(o.one_stream_seconds / o.ideal_seconds()),
            ),
            (
                "two_streams_ratio_to_ideal",
                Json::Num(o.two_streams_seconds / o.ideal_seconds()),
            ),
            ("samples", Json::int(o.samples)),
        ]),
    };
    Json::obj([
        ("tool", Json::str("pinbench")),
        ("version", Json::str(env!("CARGO_PKG_VERSION"))),
        (
            "mode",
            Json::str(if report.quick { "quick" } else { "full" }),
        ),
        ("wall_seconds", Json::Num(report.wall_seconds)),
        (
            "units",
            Json::obj([
                (
                    "gb_per_s",
                    Json::str("decimal gigabytes (1e9 bytes) per second"),
                ),
                (
                    "seconds",
                    Json::str(
                        "seconds; bandwidth times are device times from CUDA events, medians per copy; allocation and enqueue times are host times, medians per call",
                    ),
                ),
                ("bytes", Json::str("bytes")),
                (
                    "ratio_to_raw",
                    Json::str(
                        "safe-layer GB/s over the raw driver call's GB/s on the same memory, direction and size; for enqueue, time over the raw call's time",
                    ),
                ),
                (
                    "ratio_to_pageable",
                    Json::str(
                        "staged GB/s over the driver's pageable GB/s at the same direction and size, same run",
                    ),
                ),
                (
                    "speedup",
                    Json::str(
                        "allocation: the time per GiB of the figure named by speedup_over over this one's",
                    ),
                ),
            ]),
        ),
        ("header", header),
        ("bandwidth", Json::Arr(bandwidth)),
        (
            "staging_sweep",
            opt(report.staging_sweep.as_ref(), staging_sweep),
        ),
        ("bidirectional", Json::Arr(bidirectional)),
        ("allocation", Json::Arr(allocation)),
        ("enqueue", enqueue),
        ("overlap", overlap),
        (
            "failures",
            Json::Arr(report.failures().into_iter().map(Json::Str).collect()),
        ),
        ("plot", opt(plot, Json::str)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{sample_report, valid};

    fn escaped(s: &str) -> String {
        let mut out = String::new();
        escape(s, &mut out);
        out
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(escaped("plain"), r#""plain""#);
        assert_eq!(escaped(r#"a "q" \ b"#), r#""a \"q\" \\ b""#);
        assert_eq!(escaped("l1\nl2\t\r"), r#""l1\nl2\t\r""#);
        assert_eq!(escaped("\u{1}\u{1f}"), r#""\u0001\u001f""#);
        assert_eq!(escaped("H100 <&> é ✓"), "\"H100 <&> é ✓\"");
        assert!(valid(&escaped("\u{0}\u{7f}\"\\")));
    }

    #[test]
    fn values_print_as_json() {
        assert_eq!(Json::Num(f64::NAN).pretty(), "null\n");
        assert_eq!(Json::Num(f64::INFINITY).pretty(), "null\n");
        assert_eq!(Json::Num(55.25).pretty(), "55.25\n");
        assert_eq!(Json::Num(1e-7).pretty(), "0.0000001\n");
        assert_eq!(Json::Int(u64::MAX).pretty(), "18446744073709551615\n");
        assert_eq!(Json::Arr(vec![]).pretty(), "[]\n");
        assert_eq!(
            Json::obj([
                ("a", Json::Int(1)),
                ("b", Json::Arr(vec![Json::Null, Json::Bool(true)]))
            ])
            .pretty(),
            "{\n  \"a\": 1,\n  \"b\": [\n    null,\n    true\n  ]\n}\n"
        );
        for tiny in [1e-300, -2.5e-12, 1e300] {
            assert!(valid(&Json::Num(tiny).pretty()), "{tiny}");
        }
    }

    #[test]
    fn the_checker_rejects_broken_documents() {
        for bad in [
            "{",
            "[1,]",
            "{\"a\" 1}",
            "\"\u{1}\"",
            "01",
            "1.",
            "nul",
            "[] []",
            "{\"a\":1,}",
        ] {
            assert!(!valid(bad), "{bad:?}");
        }
        assert!(valid(
            "{\"a\": [1, -0.5, 2e10, \"x\\u00e9\", {}], \"b\": null}"
        ));
    }

    #[test]
    fn the_document_is_valid_json_with_every_section() {
        let report = sample_report();
        let text = document(&report, Some("out \"x\".svg")).pretty();
        assert!(valid(&text), "{text}");
        for key in [
            "\"header\"",
            "\"bandwidth\"",
            "\"bidirectional\"",
            "\"allocation\"",
            "\"enqueue\"",
            "\"overlap\"",
            "\"units\"",
            "\"gb_per_s\"",
            "\"ratio_to_raw\": 0.5",
            "\"ratio_to_raw\": null",
            "\"ratio_to_pageable\": 3.5",
            "\"ratio_to_pageable\": null",
            "\"method\": \"staged\"",
            "\"staging_sweep\"",
            "\"pool_budget_bytes\": 536870912",
            "\"chunk_bytes\": 8388608",
            "\"ratio_to_pageable\": 4",
            "\"what\": \"pool_alloc_warm\"",
            "\"what\": \"pool_alloc_cold_register\"",
            "\"what\": \"pool_alloc_cold_host_alloc\"",
            "\"speedup_over\": \"pinned_zeroed_cold\"",
            "\"speedup\": 4",
            "\"batch\": 1000",
            "\"name\": \"Test GPU <&>\"",
            "\"cuda_version\": \"13.0\"",
            "\"nvidia_driver\": \"580.1\"",
            "\"max_generation\": 5",
            "\"built\": false",
            "\"plot\": \"out \\\"x\\\".svg\"",
        ] {
            assert!(text.contains(key), "missing {key} in {text}");
        }
        let bandwidth_rows = text.matches("\"method\":").count();
        assert_eq!(bandwidth_rows, report.bandwidth.len());
        let sweep = report.staging_sweep.as_ref().unwrap();
        assert_eq!(text.matches("\"threads\":").count(), sweep.points.len() + 1);
    }

    #[test]
    fn without_a_sweep_the_document_says_null() {
        let mut report = sample_report();
        report.staging_sweep = None;
        let text = document(&report, None).pretty();
        assert!(valid(&text), "{text}");
        assert!(text.contains("\"staging_sweep\": null"), "{text}");
    }
}
