//! What a run measured: plain data, filled by the measuring modules and read by the table, the JSON document
//! and the plot. Times are seconds (`f64`), sizes bytes; bandwidth is decimal GB/s (1e9 bytes per second).

use cuda_pinned::staging::StagingOptions;
use serde::{Serialize, Serializer};

use crate::nvml::Link;

/// Which way data moves. Serialized as its [`key`](Direction::key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Host to device.
    Upload,
    /// Device to host.
    Download,
}

impl Direction {
    /// Both, in the order they are measured and shown.
    pub const BOTH: [Direction; 2] = [Direction::Upload, Direction::Download];

    /// The name in tables, JSON and the plot.
    pub fn key(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// A way of holding the host side of a transfer: one row family of the bandwidth tables.
///
/// Extension point for transfers from a warm `PinnedPool` block (`PinnedPool::alloc` of a size returned
/// earlier) and other ways: add a variant here and to [`Method::MEASURED`], its host memory to
/// `bandwidth::Host` (a staged method keeps a `Vec` with its own copy calls in `Host::upload` and
/// `Host::download`), say in [`Method::has_raw`] whether a raw reference applies, and give it a line in
/// `plot::series`. Rows exist only for measured methods, so nothing is printed for a method before it is.
/// Serialized as its [`key`](Method::key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// A `Vec<u8>` through `Stream::upload_pageable` / `download_pageable`: the driver stages it through a
    /// pinned buffer of its own, and the call blocks.
    Pageable,
    /// A `Vec<u8>` through `Stream::upload_staged` / `download_staged` with the default `StagingOptions`:
    /// worker threads copy chunks through pinned buffers of a warm `PinnedPool` while the DMA engine moves the
    /// chunks staged before. No raw reference; compared with [`Method::Pageable`] instead.
    Staged,
    /// [`Method::Staged`] with `StagingOptions::chunked_from` at 0: chunked through the pool at every size,
    /// never the driver's path. Where it beats [`Method::Pageable`] is where the crossover belongs.
    StagedChunked,
    /// `Pinned::zeroed`: `cuMemHostAlloc` with default flags.
    Pinned,
    /// `PinnedBuilder::write_combined(true)`: uncached for the CPU, meant for upload staging.
    PinnedWriteCombined,
    /// `Registered::new`: a `Vec` pinned in place with `cuMemHostRegister`.
    Registered,
}

impl Method {
    /// The methods a run measures, in the order they are shown.
    pub const MEASURED: [Method; 6] = [
        Method::Pageable,
        Method::Staged,
        Method::StagedChunked,
        Method::Pinned,
        Method::PinnedWriteCombined,
        Method::Registered,
    ];

    /// The key in JSON and the plot's legend.
    pub fn key(self) -> &'static str {
        match self {
            Method::Pageable => "pageable",
            Method::Staged => "staged",
            Method::StagedChunked => "staged_chunked",
            Method::Pinned => "pinned",
            Method::PinnedWriteCombined => "pinned_write_combined",
            Method::Registered => "registered",
        }
    }

    /// The column title in the table.
    pub fn label(self) -> &'static str {
        match self {
            Method::Pageable => "pageable",
            Method::Staged => "staged",
            Method::StagedChunked => "chunked",
            Method::Pinned => "pinned",
            Method::PinnedWriteCombined => "write-combined",
            Method::Registered => "registered",
        }
    }

    /// Whether the host memory is page-locked, so that the raw `cuMemcpy*Async` can be timed on the same memory
    /// as a reference.
    pub fn has_raw(self) -> bool {
        !matches!(
            self,
            Method::Pageable | Method::Staged | Method::StagedChunked
        )
    }

    /// Whether the figure is compared with the driver's pageable path at the same size and direction: the
    /// methods that, like it, take ordinary memory.
    pub fn against_pageable(self) -> bool {
        matches!(self, Method::Staged | Method::StagedChunked)
    }

    /// The staging options of a staged method (`None`: the defaults).
    pub fn staging_options(self) -> Option<StagingOptions> {
        (self == Method::StagedChunked).then(|| StagingOptions::default().chunked_from(0))
    }
}

/// Who makes the copy call. Serialized as its [`key`](Api::key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// The crate's safe layer (`Stream::upload` and friends), with its tracking.
    Safe,
    /// `cuMemcpyHtoDAsync_v2` / `cuMemcpyDtoHAsync_v2` through `driver_call!`, untracked: the reference.
    Raw,
}

impl Api {
    /// The key in JSON.
    pub fn key(self) -> &'static str {
        match self {
            Api::Safe => "safe",
            Api::Raw => "raw",
        }
    }
}

/// One bandwidth figure: a method, a direction and a size.
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidth {
    /// How the host memory was held.
    pub method: Method,
    /// Safe layer or raw driver call.
    pub api: Api,
    /// Which way.
    pub direction: Direction,
    /// Bytes per copy.
    pub bytes: usize,
    /// The median device time of one copy, in seconds.
    pub seconds: f64,
    /// How many timed batches the median is taken over.
    pub samples: usize,
    /// Copies per timed batch (small copies are timed in batches, so that the event resolution does not matter).
    pub batch: usize,
    /// Whether the data arrived intact (checked once, after timing).
    pub verified: bool,
}

impl Bandwidth {
    /// Decimal GB/s.
    pub fn gb_per_s(&self) -> f64 {
        gb_per_s(self.bytes, self.seconds)
    }
}

/// `bytes` moved in `seconds`, in decimal GB/s.
pub fn gb_per_s(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// An upload and a download at the same time, on two streams, from and to pinned memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Bidirectional {
    /// Bytes each way.
    pub bytes: usize,
    /// Median time for both to complete, in seconds.
    pub both_seconds: f64,
    /// Median time of the upload alone, same buffers.
    pub upload_seconds: f64,
    /// Median time of the download alone, same buffers.
    pub download_seconds: f64,
    /// Repetitions the medians are taken over.
    pub samples: usize,
    /// Whether both copies' data arrived intact.
    pub verified: bool,
}

impl Bidirectional {
    /// Both directions' bytes over the time both took, in GB/s.
    pub fn aggregate_gb_per_s(&self) -> f64 {
        gb_per_s(2 * self.bytes, self.both_seconds)
    }

    /// The aggregate as a fraction of the two directions' speeds alone added up: 1.0 is full duplex.
    pub fn ratio_to_sum(&self) -> f64 {
        self.aggregate_gb_per_s()
            / (gb_per_s(self.bytes, self.upload_seconds)
                + gb_per_s(self.bytes, self.download_seconds))
    }
}

/// What an allocation figure times.
///
/// Extension point: a new kind of allocation gets a variant here, is timed in `costs::allocation`, and names
/// the figure it reads as a ratio to in [`Alloc::reference`]. Only measured kinds produce rows. Each is
/// serialized as its key in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[expect(
    clippy::enum_variant_names,
    reason = "`PoolColdHostAlloc` ends in `Pinning::HostAlloc`, not in this enum's name"
)]
pub enum Alloc {
    /// One cold `Pinned::zeroed` of a large size (cuMemHostAlloc plus the zeroing), scaled per GiB.
    #[serde(rename = "pinned_zeroed_cold")]
    PinnedCold,
    /// `Pinned::zeroed` of 1 MiB, per call.
    #[serde(rename = "pinned_zeroed_per_call")]
    PinnedPerCall,
    /// `PinnedPool::alloc` of 1 MiB from a pool that holds an idle block of that size, and its drop (the block
    /// goes back to the pool), per call: the reason for pooling. Timed in batches, one clock read per batch.
    #[serde(rename = "pool_alloc_warm")]
    PoolWarm,
    /// The first `PinnedPool::alloc` of a large size from a fresh pool built with `Pinning::Register`: pages
    /// touched on several threads, then `cuMemHostRegister`. Scaled per GiB.
    #[serde(rename = "pool_alloc_cold_register")]
    PoolColdRegister,
    /// The first `PinnedPool::alloc` of a large size from a fresh pool built with `Pinning::HostAlloc`:
    /// `cuMemHostAlloc`, then the zeroing on several threads. Scaled per GiB.
    #[serde(rename = "pool_alloc_cold_host_alloc")]
    PoolColdHostAlloc,
    /// `Registered::new` of a `Vec` whose pages were already written, scaled per GiB.
    #[serde(rename = "registered_new_touched")]
    RegisterTouched,
    /// `Registered::new` of a fresh `vec![0u8; n]` (calloc: pages not yet touched), scaled per GiB.
    #[serde(rename = "registered_new_untouched")]
    RegisterUntouched,
}

impl Alloc {
    /// The row title in the table.
    pub fn label(self) -> &'static str {
        match self {
            Alloc::PinnedCold => "Pinned::zeroed, cold",
            Alloc::PinnedPerCall => "Pinned::zeroed, per call",
            Alloc::PoolWarm => "PinnedPool::alloc + drop, warm",
            Alloc::PoolColdRegister => "PinnedPool::alloc, cold, Register",
            Alloc::PoolColdHostAlloc => "PinnedPool::alloc, cold, HostAlloc",
            Alloc::RegisterTouched => "Registered::new, touched Vec",
            Alloc::RegisterUntouched => "Registered::new, untouched Vec",
        }
    }

    /// Whether the figure is shown per call (small buffers) rather than per GiB.
    pub fn per_call(self) -> bool {
        matches!(self, Alloc::PinnedPerCall | Alloc::PoolWarm)
    }

    /// The figure this one is compared with, as `reference time / this time` (how many times faster): the
    /// pool's against `Pinned::zeroed` of the same kind (per call, or cold per GiB).
    pub fn reference(self) -> Option<Alloc> {
        match self {
            Alloc::PoolWarm => Some(Alloc::PinnedPerCall),
            Alloc::PoolColdRegister | Alloc::PoolColdHostAlloc => Some(Alloc::PinnedCold),
            _ => None,
        }
    }
}

/// One allocation figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// What was timed.
    pub what: Alloc,
    /// Bytes per call.
    pub bytes: usize,
    /// Timed calls, or batches of calls, the median is taken over.
    pub samples: usize,
    /// Calls per timed batch (1: each call timed on its own).
    pub batch: usize,
    /// Median host time of one call, in seconds.
    pub seconds: f64,
}

impl Allocation {
    /// The median time scaled to one GiB, in seconds.
    pub fn seconds_per_gib(&self) -> f64 {
        self.seconds * (1u64 << 30) as f64 / self.bytes as f64
    }
}

/// `--staging-sweep`: staged transfers of one size for each chunk size and thread count, beside the driver's
/// pageable path at the same size, measured in the same sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct StagingSweep {
    /// Bytes per transfer.
    pub bytes: usize,
    /// The budget of the sweep's pool: room for two transfers' worth of staging buffers at every point.
    pub pool_budget: usize,
    /// `StagingOptions::default().chunk_bytes` on this machine.
    pub default_chunk_bytes: usize,
    /// `StagingOptions::default().threads` on this machine.
    pub default_threads: usize,
    /// The driver's pageable path at `bytes`, one figure per direction: the reference.
    pub pageable: Vec<Bandwidth>,
    /// One staged figure per direction, chunk size and thread count.
    pub points: Vec<SweepPoint>,
}

/// One point of the staging sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    /// `StagingOptions::chunk_bytes`.
    pub chunk_bytes: usize,
    /// `StagingOptions::threads`.
    pub threads: usize,
    /// The figure ([`Method::Staged`], through `upload_staged_with` / `download_staged_with`).
    pub figure: Bandwidth,
}

impl StagingSweep {
    /// The chunk sizes measured, ascending.
    pub fn chunk_sizes(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.points.iter().map(|p| p.chunk_bytes).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The thread counts measured, ascending.
    pub fn thread_counts(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.points.iter().map(|p| p.threads).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The point for (direction, chunk size, threads), if measured.
    pub fn find(
        &self,
        direction: Direction,
        chunk_bytes: usize,
        threads: usize,
    ) -> Option<&SweepPoint> {
        self.points.iter().find(|p| {
            p.figure.direction == direction && p.chunk_bytes == chunk_bytes && p.threads == threads
        })
    }

    /// The driver's pageable figure of `direction`.
    pub fn pageable(&self, direction: Direction) -> Option<&Bandwidth> {
        self.pageable.iter().find(|b| b.direction == direction)
    }

    /// A point's GB/s over the driver's pageable GB/s in the same direction.
    pub fn ratio_to_pageable(&self, point: &SweepPoint) -> Option<f64> {
        let pageable = self.pageable(point.figure.direction)?;
        Some(point.figure.gb_per_s() / pageable.gb_per_s())
    }

    /// The fastest point of `direction`.
    pub fn best(&self, direction: Direction) -> Option<&SweepPoint> {
        self.points
            .iter()
            .filter(|p| p.figure.direction == direction)
            .max_by(|a, b| a.figure.gb_per_s().total_cmp(&b.figure.gb_per_s()))
    }
}

/// Host time to enqueue a 64-byte upload from pinned memory, and to launch a small kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueue {
    /// `cuMemcpyHtoDAsync_v2` through `driver_call!`, seconds per call.
    pub raw: f64,
    /// `Stream::upload`, always on one stream (the tracker's no-event path).
    pub same_stream: f64,
    /// `Stream::upload`, alternating two streams (an event and a device-side wait per copy).
    pub cross_stream: f64,
    /// The raw driver calls of a crossing, alternating two streams: `cuEventRecord` on the stream of the previous
    /// copy, `cuStreamWaitEvent` on the next one, the copy (two events reused in turn): the floor any tracking
    /// of a crossing pays.
    pub raw_cross_stream: f64,
    /// `same_stream` over `raw`, batch by batch (the four copy figures take turns, batch by batch).
    pub same_stream_extra: Extra,
    /// `cross_stream` over `raw_cross_stream`, batch by batch.
    pub cross_stream_extra: Extra,
    /// The crate's two copy figures again from a thread with no context current (the raw references keep
    /// theirs: the driver's copy needs one).
    pub no_context: NoContext,
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies per timed batch.
    pub batch: usize,
    /// Batches the medians are taken over.
    pub samples: usize,
    /// The launch figures, or why there are none (the error that stopped them; on the simulated driver, which
    /// has no stand-in for pinbench's kernel, they are not taken).
    pub launch: Result<LaunchCost, String>,
}

/// Host time of launching a small kernel (two buffers, two values; one block) on one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchCost {
    /// Through `cuLaunchKernel` called with `driver_call!` and a parameter array, seconds per launch.
    pub raw: f64,
    /// The same launch through `Stream::launch` (`Arg::read`, `Arg::write`, `Arg::value`), on the same stream,
    /// its batches taking turns with the raw ones'.
    pub crate_launch: f64,
    /// Batches the medians are taken over, each way.
    pub samples: usize,
    /// `crate_launch` over `raw`, batch by batch.
    pub extra: Extra,
    /// `Stream::launch` from a thread with no context current, in the same turns.
    pub crate_launch_no_context: f64,
    /// `crate_launch_no_context` over `raw`, batch by batch.
    pub extra_no_context: Extra,
    /// Whether the launched kernel's output was as expected, checked once after the timing.
    pub verified: bool,
}

/// [`Enqueue`]'s figures of the crate taken on a thread with no context current, in the same turns.
#[derive(Debug, Clone, PartialEq)]
pub struct NoContext {
    /// `Stream::upload` on one stream, seconds per call.
    pub same_stream: f64,
    /// `Stream::upload` alternating two streams.
    pub cross_stream: f64,
    /// `same_stream` over the raw copy (with its context current), batch by batch.
    pub same_stream_extra: Extra,
    /// `cross_stream` over the raw record + wait + copy, batch by batch.
    pub cross_stream_extra: Extra,
}

/// What a call of the crate costs over its reference, from batches of both taken in turns: for each round, the
/// crate's seconds per call less the reference's in the same round; the median of those differences and their
/// 10th and 90th percentiles, which say how far one run's figure can be trusted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extra {
    /// Seconds per call.
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Extra {
    /// From the per-round seconds per call of the crate's call and of its reference, taken in the same rounds.
    pub fn of(calls: &[f64], reference: &[f64]) -> Extra {
        Extra::spread(calls.iter().zip(reference).map(|(c, r)| c - r).collect())
    }

    /// The median of `values` and their 10th and 90th percentiles (NaN for none).
    pub fn spread(mut values: Vec<f64>) -> Extra {
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            values
                .get(((values.len().saturating_sub(1)) as f64 * q).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        Extra {
            median: at(0.5),
            p10: at(0.1),
            p90: at(0.9),
        }
    }
}

/// The crate's staged path (`upload_staged` / `download_staged`, default options) against the driver's pageable
/// path at one size and direction, from batches of the two taken in turns through one `Vec`: the driver's
/// pageable copies vary from batch to batch by as much as the difference sought, so each round compares two
/// batches taken back to back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StagedTurns {
    pub direction: Direction,
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies per batch.
    pub batch: usize,
    /// Rounds (one batch each way per round).
    pub rounds: usize,
    /// Per round, the pageable batch's device time over the staged one's (above 1: staged is faster): the
    /// median and the 10th and 90th percentiles, in `Extra`'s fields.
    pub ratio: Extra,
}

/// A pipeline of uploads and kernels, on two streams and on one (feature `gpu` only).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(not(feature = "gpu"), allow(dead_code))]
pub struct Overlap {
    /// Chunks uploaded.
    pub chunks: usize,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// The kernel time asked for per chunk, in seconds (the chunk's copy time).
    pub spin_seconds: f64,
    /// All uploads alone, one stream.
    pub copy_seconds: f64,
    /// All kernels alone, one stream.
    pub kernel_seconds: f64,
    /// Upload, kernel, upload, kernel... on one stream.
    pub one_stream_seconds: f64,
    /// A copy stream and a compute stream, double-buffered, ordered by events.
    pub two_streams_seconds: f64,
    /// Repetitions the medians are taken over.
    pub samples: usize,
}

impl Overlap {
    /// The best a pipeline can do: the longer of all copies and all kernels.
    pub fn ideal_seconds(&self) -> f64 {
        self.copy_seconds.max(self.kernel_seconds)
    }
}

/// One CUDA device as the header describes it, and as `--json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceInfo {
    /// The driver's ordinal.
    pub ordinal: usize,
    /// Such as `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// (major, minor); `"9.0"` in JSON.
    #[serde(serialize_with = "major_minor")]
    pub compute_capability: (u32, u32),
    /// Device memory, bytes.
    pub memory_bytes: usize,
    /// Such as `0000:65:00.0`.
    pub pci_bus_id: String,
    /// Copy engines: with two or more, an upload and a download run at once.
    pub copy_engines: u32,
}

/// `(9, 0)` as the string `"9.0"`.
fn major_minor<S: Serializer>(version: &(u32, u32), serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("{}.{}", version.0, version.1))
}

/// What every report starts with: the machine the figures belong to.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The device measured (device 0).
    pub device: DeviceInfo,
    /// How many CUDA devices the driver sees.
    pub device_count: usize,
    /// The NVIDIA driver release from NVML, such as `580.159.04`, where NVML could be read.
    pub nvidia_driver: Option<String>,
    /// The CUDA version the driver supports, as `cuDriverGetVersion` reports it (`1000 * major + 10 * minor`).
    pub cuda_version: i32,
    /// Where libcuda was loaded from.
    pub driver_library: String,
    /// The PCIe link, read while copies ran, where NVML could be read.
    pub pcie: Option<Link>,
    /// Whether the driver is cuda-pinned's simulated one: the figures are a simulation's, not a GPU's.
    pub simulated: bool,
}

impl Header {
    /// `13.0` from `13000`.
    pub fn cuda_version_text(&self) -> String {
        format!(
            "{}.{}",
            self.cuda_version / 1000,
            self.cuda_version % 1000 / 10
        )
    }
}

/// A whole run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `--quick` or not.
    pub quick: bool,
    /// The machine.
    pub header: Header,
    /// Every bandwidth figure, safe and raw.
    pub bandwidth: Vec<Bandwidth>,
    /// `--staging-sweep`'s figures; `None` where it was not asked for.
    pub staging_sweep: Option<StagingSweep>,
    /// Staged against the driver's pageable path, in turns, size by size.
    pub staged_turns: Vec<StagedTurns>,
    /// Both directions at once.
    pub bidirectional: Vec<Bidirectional>,
    /// Allocation and registration costs.
    pub allocation: Vec<Allocation>,
    /// Enqueue overhead; `None` where it could not be measured (see `not_measured`).
    pub enqueue: Option<Enqueue>,
    /// The overlap pipeline; `None` where pinbench was built without feature `gpu`, or where it could not be
    /// measured.
    pub overlap: Option<Overlap>,
    /// The sections that could not be measured, each as `section: the error`; the others are still reported.
    pub not_measured: Vec<String>,
    /// The wall time of the whole run, in seconds.
    pub wall_seconds: f64,
}

impl Report {
    /// The figure for (method, api, direction, bytes), if measured.
    pub fn find(
        &self,
        method: Method,
        api: Api,
        direction: Direction,
        bytes: usize,
    ) -> Option<&Bandwidth> {
        self.bandwidth.iter().find(|b| {
            b.method == method && b.api == api && b.direction == direction && b.bytes == bytes
        })
    }

    /// A safe-layer figure as a ratio to the raw driver call on the same memory, direction and size: 1.0 means
    /// the safe layer costs nothing. `None` for pageable memory (no raw reference) or where not measured.
    pub fn ratio_to_raw(&self, b: &Bandwidth) -> Option<f64> {
        if b.api != Api::Safe || !b.method.has_raw() {
            return None;
        }
        let raw = self.find(b.method, Api::Raw, b.direction, b.bytes)?;
        Some(b.gb_per_s() / raw.gb_per_s())
    }

    /// A figure of a method that takes ordinary memory (staged) as a ratio to the driver's pageable path at the
    /// same size and direction: 3.5 means three and a half times as fast. `None` for other methods, raw figures,
    /// or where the pageable figure was not measured.
    pub fn ratio_to_pageable(&self, b: &Bandwidth) -> Option<f64> {
        if b.api != Api::Safe || !b.method.against_pageable() {
            return None;
        }
        let pageable = self.find(Method::Pageable, Api::Safe, b.direction, b.bytes)?;
        Some(b.gb_per_s() / pageable.gb_per_s())
    }

    /// An allocation figure's speed-up over its reference ([`Alloc::reference`]): the reference's time per GiB
    /// over this one's (equal to the per-call ratio at equal sizes). `None` where either was not measured.
    pub fn alloc_speedup(&self, a: &Allocation) -> Option<(Alloc, f64)> {
        let reference = a.what.reference()?;
        let r = self.allocation.iter().find(|r| r.what == reference)?;
        Some((reference, r.seconds_per_gib() / a.seconds_per_gib()))
    }

    /// The sizes measured, ascending.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.bandwidth.iter().map(|b| b.bytes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// What did not arrive intact, and (on a GPU) a kernel launch that could not be timed, one line each; empty
    /// when everything was verified.
    pub fn failures(&self) -> Vec<String> {
        let mut failures: Vec<String> = self
            .bandwidth
            .iter()
            .filter(|b| !b.verified)
            .map(|b| {
                format!(
                    "{} {} {} of {}",
                    b.method.key(),
                    b.api.key(),
                    b.direction.key(),
                    size_label(b.bytes)
                )
            })
            .collect();
        failures.extend(
            self.bidirectional
                .iter()
                .filter(|b| !b.verified)
                .map(|b| format!("both directions at once, {}", size_label(b.bytes))),
        );
        if let Some(sweep) = &self.staging_sweep {
            failures.extend(sweep.pageable.iter().filter(|b| !b.verified).map(|b| {
                format!(
                    "staging sweep: pageable {} of {}",
                    b.direction.key(),
                    size_label(b.bytes)
                )
            }));
            failures.extend(sweep.points.iter().filter(|p| !p.figure.verified).map(|p| {
                format!(
                    "staging sweep: staged {} of {}, chunks of {}, {} threads",
                    p.figure.direction.key(),
                    size_label(p.figure.bytes),
                    size_label(p.chunk_bytes),
                    p.threads
                )
            }));
        }
        match self.enqueue.as_ref().map(|e| &e.launch) {
            Some(Ok(launch)) if !launch.verified => {
                failures.push("kernel launch (the kernel's output, y = a * x)".into());
            }
            Some(Err(why)) if !self.header.simulated => {
                failures.push(format!("kernel launch: {why}"))
            }
            _ => {}
        }
        failures
    }
}

/// `4 KiB`, `256 MiB`, `1 GiB`: sizes as tables show them (powers of two only print whole).
pub fn size_label(bytes: usize) -> String {
    const UNITS: [(&str, usize); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    for (unit, scale) in UNITS {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{} {unit}", bytes / scale);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::sample_report;

    #[test]
    fn ratios_are_to_the_raw_call_on_the_same_memory() {
        let report = sample_report();
        let safe = report
            .find(Method::Pinned, Api::Safe, Direction::Upload, 4096)
            .unwrap();
        assert!((report.ratio_to_raw(safe).unwrap() - 0.5).abs() < 1e-9);
        let pageable = report
            .find(Method::Pageable, Api::Safe, Direction::Upload, 4096)
            .unwrap();
        assert_eq!(report.ratio_to_raw(pageable), None);
        let raw = report
            .find(Method::Pinned, Api::Raw, Direction::Upload, 4096)
            .unwrap();
        assert_eq!(report.ratio_to_raw(raw), None);
        assert_eq!(report.sizes(), vec![4096, 1 << 20, 64 << 20]);
        let b = &report.bidirectional[0];
        assert!((b.ratio_to_sum() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn staged_figures_are_compared_with_the_drivers_pageable_path() {
        let mut report = sample_report();
        for (bytes, direction) in [(4096, Direction::Upload), (64 << 20, Direction::Download)] {
            let staged = report
                .find(Method::Staged, Api::Safe, direction, bytes)
                .unwrap();
            assert!((report.ratio_to_pageable(staged).unwrap() - 3.5).abs() < 1e-9);
            assert_eq!(report.ratio_to_raw(staged), None);
        }
        let pinned = report
            .find(Method::Pinned, Api::Safe, Direction::Upload, 4096)
            .unwrap();
        assert_eq!(report.ratio_to_pageable(pinned), None);
        let pageable = report
            .find(Method::Pageable, Api::Safe, Direction::Upload, 4096)
            .unwrap();
        assert_eq!(report.ratio_to_pageable(pageable), None);
        // Without the pageable figure at that size, no ratio.
        report
            .bandwidth
            .retain(|b| !(b.method == Method::Pageable && b.bytes == 4096));
        let staged = report
            .find(Method::Staged, Api::Safe, Direction::Upload, 4096)
            .unwrap();
        assert_eq!(report.ratio_to_pageable(staged), None);
        assert!(!Method::Staged.has_raw() && Method::Staged.against_pageable());
        assert!(Method::MEASURED.contains(&Method::Staged));
    }

    #[test]
    fn pool_allocations_are_compared_with_pinned_zeroed_of_the_same_kind() {
        let report = sample_report();
        let speedup = |what| {
            let a = report.allocation.iter().find(|a| a.what == what).unwrap();
            report.alloc_speedup(a)
        };
        // Cold: per GiB (the pool's figures are of 256 MiB, Pinned::zeroed's of 1 GiB).
        let (reference, x) = speedup(Alloc::PoolColdRegister).unwrap();
        assert_eq!(reference, Alloc::PinnedCold);
        assert!((x - 4.0).abs() < 1e-9);
        let (_, x) = speedup(Alloc::PoolColdHostAlloc).unwrap();
        assert!((x - 2.0).abs() < 1e-9);
        // Warm: per call, against Pinned::zeroed of the same 1 MiB.
        let (reference, x) = speedup(Alloc::PoolWarm).unwrap();
        assert_eq!(reference, Alloc::PinnedPerCall);
        assert!((x - 2000.0).abs() < 1e-6);
        assert_eq!(speedup(Alloc::PinnedCold), None);
        assert!(Alloc::PoolWarm.per_call() && !Alloc::PoolColdRegister.per_call());
    }

    #[test]
    fn the_sweep_finds_points_ratios_and_the_fastest() {
        let sweep = crate::testdata::sample_sweep();
        assert_eq!(sweep.chunk_sizes(), vec![4 << 20, 8 << 20]);
        assert_eq!(sweep.thread_counts(), vec![1, 4]);
        let p = sweep.find(Direction::Upload, 8 << 20, 4).unwrap();
        assert!((p.figure.gb_per_s() - 32.0).abs() < 1e-9);
        assert!((sweep.ratio_to_pageable(p).unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(sweep.find(Direction::Upload, 2 << 20, 4), None);
        let best = sweep.best(Direction::Download).unwrap();
        assert_eq!((best.chunk_bytes, best.threads), (8 << 20, 4));
        assert_eq!(best.figure.direction, Direction::Download);
    }

    #[test]
    fn failed_sweep_checks_are_listed() {
        let mut report = sample_report();
        assert!(report.failures().is_empty());
        let sweep = report.staging_sweep.as_mut().unwrap();
        sweep.points[3].figure.verified = false;
        sweep.pageable[0].verified = false;
        let failures = report.failures();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(
            failures
                .iter()
                .any(|f| f.contains("pageable upload of 256 MiB"))
        );
        assert!(
            failures
                .iter()
                .any(|f| f.contains("staged download of 256 MiB, chunks of 4 MiB, 4 threads")),
            "{failures:?}"
        );
    }

    #[test]
    fn sizes_are_labelled_in_binary_units() {
        assert_eq!(size_label(4096), "4 KiB");
        assert_eq!(size_label(256 << 20), "256 MiB");
        assert_eq!(size_label(1 << 30), "1 GiB");
        assert_eq!(size_label(64), "64 B");
        assert_eq!(size_label(1536), "1536 B");
        assert_eq!(size_label(0), "0 B");
    }

    #[test]
    fn bandwidth_is_decimal_gigabytes() {
        assert!((gb_per_s(1_000_000_000, 0.5) - 2.0).abs() < 1e-12);
    }
}
