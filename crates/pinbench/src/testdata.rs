//! Made-up results for the tests of the table, the JSON document and the plot (test builds only).

use crate::nvml::Link;
use crate::results::{
    Alloc, Allocation, Api, Bandwidth, Bidirectional, DeviceInfo, Direction, Enqueue, Extra,
    Header, LaunchCost, Method, NoContext, Overlap, Report, StagedTurns, StagingSweep, SweepPoint,
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

/// The launch figures of `report` (of [`sample_report`], which has them), to change in a test.
pub fn launch_of(report: &mut Report) -> &mut LaunchCost {
    let enqueue = report
        .enqueue
        .as_mut()
        .expect("the sample has enqueue figures");
    enqueue
        .launch
        .as_mut()
        .expect("the sample has launch figures")
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
            simulated: false,
        },
        bandwidth,
        staged_turns: Direction::BOTH
            .into_iter()
            .map(|direction| StagedTurns {
                direction,
                bytes: 64 << 20,
                batch: 1,
                rounds: 9,
                ratio: Extra {
                    median: 1.25,
                    p10: 1.1,
                    p90: 1.4,
                },
            })
            .collect(),
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
        enqueue: Some(Enqueue {
            raw: 1e-6,
            same_stream: 1e-6,
            cross_stream: 2e-6,
            raw_cross_stream: 1.5e-6,
            same_stream_extra: Extra {
                median: 0.02e-6,
                p10: -0.01e-6,
                p90: 0.05e-6,
            },
            cross_stream_extra: Extra {
                median: 0.5e-6,
                p10: 0.4e-6,
                p90: 0.7e-6,
            },
            no_context: NoContext {
                same_stream: 1.1e-6,
                cross_stream: 2.2e-6,
                same_stream_extra: Extra {
                    median: 0.1e-6,
                    p10: 0.05e-6,
                    p90: 0.15e-6,
                },
                cross_stream_extra: Extra {
                    median: 0.7e-6,
                    p10: 0.6e-6,
                    p90: 0.8e-6,
                },
            },
            bytes: 64,
            batch: 500,
            samples: 10,
            launch: Ok(LaunchCost {
                raw: 2e-6,
                crate_launch: 2.25e-6,
                crate_launch_no_context: 2.4e-6,
                samples: 100,
                extra: Extra {
                    median: 0.25e-6,
                    p10: 0.2e-6,
                    p90: 0.3e-6,
                },
                extra_no_context: Extra {
                    median: 0.4e-6,
                    p10: 0.35e-6,
                    p90: 0.45e-6,
                },
                verified: true,
            }),
        }),
        overlap: None,
        not_measured: Vec::new(),
        wall_seconds: 12.5,
    }
}

/// A made-up overlap pipeline, as a build with feature `gpu` measures it: copies 5 ms, kernels 4 ms (so the ideal
/// is 5 ms), one stream 9 ms, two streams 7.5 ms (1.5 x the ideal).
pub fn sample_overlap() -> Overlap {
    Overlap {
        chunks: 64,
        chunk_bytes: 4 << 20,
        spin_seconds: 0.004 / 64.0,
        copy_seconds: 0.005,
        kernel_seconds: 0.004,
        one_stream_seconds: 0.009,
        two_streams_seconds: 0.0075,
        samples: 5,
    }
}
