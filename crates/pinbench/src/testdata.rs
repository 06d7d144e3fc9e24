//! Made-up results for the tests of the table, the JSON document and the plot (test builds only).

use crate::nvml::Link;
use crate::results::{
    Alloc, Allocation, Api, Bandwidth, Bidirectional, DeviceInfo, Direction, Enqueue, Header,
    Method, Report, StagingSweep, SweepPoint,
};

/// A made-up figure of `gbps` GB/s.
fn row(method: Method, api: Api, direction: Direction, bytes: usize, gbps: f64) -> Bandwidth {
    Bandwidth {
        method,
        api,
        direction,
        bytes,
        seconds: bytes as f64 / (gbps * 1e9),
        samples: 5,
        batch: 1,
        verified: true,
    }
}

/// A made-up staging sweep at 256 MiB: pageable 8 GB/s each way, chunks of 4 and 8 MiB by 1 and 4 threads, the
/// staged figure `chunk in MiB x threads` GB/s (8 MiB x 4 threads, the default, is 32 GB/s: 4.00x).
pub fn sample_sweep() -> StagingSweep {
    let bytes = 256 << 20;
    let mut points = Vec::new();
    for chunk_mib in [4usize, 8] {
        for threads in [1usize, 4] {
            for direction in Direction::BOTH {
                points.push(SweepPoint {
                    chunk_bytes: chunk_mib << 20,
                    threads,
                    figure: row(
                        Method::Staged,
                        Api::Safe,
                        direction,
                        bytes,
                        (chunk_mib * threads) as f64,
                    ),
                });
            }
        }
    }
    StagingSweep {
        bytes,
        pool_budget: 512 << 20,
        default_chunk_bytes: 8 << 20,
        default_threads: 4,
        pageable: Direction::BOTH
            .into_iter()
            .map(|d| row(Method::Pageable, Api::Safe, d, bytes, 8.0))
            .collect(),
        points,
    }
}

/// A small made-up report for the tests of the table, the JSON document and the plot.
pub fn sample_report() -> Report {
    let mut bandwidth = Vec::new();
    for direction in Direction::BOTH {
        for (i, bytes) in [4096usize, 1 << 20, 64 << 20].into_iter().enumerate() {
            let scale = (i + 1) as f64;
            bandwidth.push(row(
                Method::Pageable,
                Api::Safe,
                direction,
                bytes,
                2.0 * scale,
            ));
            bandwidth.push(row(
                Method::Staged,
                Api::Safe,
                direction,
                bytes,
                7.0 * scale,
            ));
            bandwidth.push(row(
                Method::Pinned,
                Api::Safe,
                direction,
                bytes,
                5.0 * scale,
            ));
            bandwidth.push(row(
                Method::Pinned,
                Api::Raw,
                direction,
                bytes,
                10.0 * scale,
            ));
            bandwidth.push(row(
                Method::Registered,
                Api::Safe,
                direction,
                bytes,
                9.0 * scale,
            ));
            bandwidth.push(row(
                Method::Registered,
                Api::Raw,
                direction,
                bytes,
                9.0 * scale,
            ));
        }
    }
    Report {
        quick: true,
        header: Header {
            device: DeviceInfo {
                ordinal: 0,
                name: "Test GPU <&>".into(),
                compute_capability: (9, 0),
                memory_bytes: 80 << 30,
                pci_bus_id: "0000:65:00.0".into(),
                copy_engines: 3,
            },
            device_count: 1,
            nvidia_driver: Some("580.1".into()),
            cuda_version: 13000,
            driver_library: "libcuda.so.1".into(),
            pcie: Some(Link {
                generation: 5,
                width: 16,
                max_generation: 5,
                max_width: 16,
            }),
        },
        bandwidth,
        staging_sweep: Some(sample_sweep()),
        bidirectional: vec![Bidirectional {
            bytes: 256 << 20,
            both_seconds: 0.005,
            upload_seconds: 0.005,
            download_seconds: 0.005,
            samples: 3,
            verified: true,
        }],
        allocation: vec![
            Allocation {
                what: Alloc::PinnedCold,
                bytes: 1 << 30,
                samples: 3,
                batch: 1,
                seconds: 0.4,
            },
            Allocation {
                what: Alloc::PinnedPerCall,
                bytes: 1 << 20,
                samples: 20,
                batch: 1,
                seconds: 250e-6,
            },
            Allocation {
                what: Alloc::PoolWarm,
                bytes: 1 << 20,
                samples: 25,
                batch: 1000,
                seconds: 125e-9,
            },
            // Measured at 256 MiB, as in --quick: 0.025 s is 0.1 s per GiB, 4x faster than Pinned::zeroed.
            Allocation {
                what: Alloc::PoolColdRegister,
                bytes: 256 << 20,
                samples: 1,
                batch: 1,
                seconds: 0.025,
            },
            Allocation {
                what: Alloc::PoolColdHostAlloc,
                bytes: 256 << 20,
                samples: 1,
                batch: 1,
                seconds: 0.05,
            },
        ],
        enqueue: Enqueue {
            raw: 1e-6,
            same_stream: 1e-6,
            cross_stream: 2e-6,
            raw_cross_stream: 1.5e-6,
            bytes: 64,
            batch: 500,
            samples: 10,
        },
        overlap: None,
        wall_seconds: 12.5,
    }
}

/// A strict JSON checker (RFC 8259 grammar), enough to prove the printer's output well-formed.
pub fn valid(s: &str) -> bool {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && matches!(b[*i], b' ' | b'\n' | b'\r' | b'\t') {
            *i += 1;
        }
    }
    fn value(b: &[u8], i: &mut usize) -> bool {
        ws(b, i);
        let ok = match b.get(*i) {
            Some(b'{') => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    true
                } else {
                    loop {
                        ws(b, i);
                        if !string(b, i) {
                            break false;
                        }
                        ws(b, i);
                        if b.get(*i) != Some(&b':') {
                            break false;
                        }
                        *i += 1;
                        if !value(b, i) {
                            break false;
                        }
                        match b.get(*i) {
                            Some(b',') => *i += 1,
                            Some(b'}') => {
                                *i += 1;
                                break true;
                            }
                            _ => break false,
                        }
                    }
                }
            }
            Some(b'[') => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    true
                } else {
                    loop {
                        if !value(b, i) {
                            break false;
                        }
                        match b.get(*i) {
                            Some(b',') => *i += 1,
                            Some(b']') => {
                                *i += 1;
                                break true;
                            }
                            _ => break false,
                        }
                    }
                }
            }
            Some(b'"') => string(b, i),
            Some(b't') => lit(b, i, b"true"),
            Some(b'f') => lit(b, i, b"false"),
            Some(b'n') => lit(b, i, b"null"),
            Some(_) => number(b, i),
            None => false,
        };
        ws(b, i);
        ok
    }
    fn lit(b: &[u8], i: &mut usize, word: &[u8]) -> bool {
        let ok = b[*i..].starts_with(word);
        *i += word.len();
        ok
    }
    fn string(b: &[u8], i: &mut usize) -> bool {
        if b.get(*i) != Some(&b'"') {
            return false;
        }
        *i += 1;
        while let Some(&c) = b.get(*i) {
            *i += 1;
            match c {
                b'"' => return true,
                b'\\' => match b.get(*i) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => *i += 1,
                    Some(b'u') => {
                        let hex = b.get(*i + 1..*i + 5);
                        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                            return false;
                        }
                        *i += 5;
                    }
                    _ => return false,
                },
                c if c < 0x20 => return false,
                _ => {}
            }
        }
        false
    }
    fn number(b: &[u8], i: &mut usize) -> bool {
        let start = *i;
        if b.get(*i) == Some(&b'-') {
            *i += 1;
        }
        let digits = |i: &mut usize| {
            let s = *i;
            while b.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i > s
        };
        if b.get(*i) == Some(&b'0') {
            *i += 1;
        } else if !digits(i) {
            return false;
        }
        if b.get(*i) == Some(&b'.') {
            *i += 1;
            if !digits(i) {
                return false;
            }
        }
        if matches!(b.get(*i), Some(b'e' | b'E')) {
            *i += 1;
            if matches!(b.get(*i), Some(b'+' | b'-')) {
                *i += 1;
            }
            if !digits(i) {
                return false;
            }
        }
        *i > start
    }
    let b = s.as_bytes();
    let mut i = 0;
    value(b, &mut i) && i == b.len()
}
