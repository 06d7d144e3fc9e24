//! `pinbench devices`: every device of the machine, for hosts of several GPUs, each on a PCIe link of its own and
//! perhaps joined by NVLink. In one run:
//!
//! 1. per device, an upload and a download between [`Pinned`] memory of its context and a [`DeviceBuffer`], on a
//!    stream of that context (CUDA events, medians after warm-up, as the bandwidth run times copies);
//! 2. host to all (as nvbandwidth's `host_to_all`): every device uploads its own pinned buffer at the same time,
//!    one host thread per device, started together by a [`Barrier`];
//! 3. the same from one pinned buffer shared by all devices, read by every device's stream at once;
//! 4. the copy matrix: for every ordered pair of devices, a copy from a buffer of the source into one of the
//!    destination by [`Stream::copy`] on a stream of the destination (the diagonal copies within a device).
//!    Between two devices, peer access is enabled both ways before the pair's first copy, so that enabling it is
//!    never timed; the copies then go direct (`cuMemcpyPeerAsync`) where the devices can access each other's
//!    memory, else the library stages them through pinned memory, and each cell says which;
//! 5. prefetched gathers: [`Prefetcher::sharded`] of [`GatherBatch`], one feed per device, each device's gather
//!    kernel reading 16 KiB rows at random indices from one table of mapped, portable pinned memory that every
//!    device's [`RowTable`] shares; GB/s fed to device 0 alone and to every device at once, and their ratio (the
//!    goal: two devices fed at least 1.8x one device's rate);
//! 6. the header: each device's name, PCI bus id, NUMA node (from sysfs), the node the library places its pinned
//!    memory on ([`Placement::DeviceNode`]), and PCIe link (NVML, read under load), the driver release and its
//!    CUDA version.
//!
//! The figures of 2, 3 and 5 span several devices, and CUDA times events of one device only, so they are host
//! wall times: from a common start (a barrier's release; for 5, a gate that the prefetchers' workers wait at)
//! to the last thread's end (each thread synchronizes its stream), per round, medians over rounds after
//! warm-up. They are compared with device 0 alone timed the same way, so that the host's share of the time (the
//! synchronization) weighs on both sides of the ratio.
//!
//! Every copy's data is checked once (for 5, one batch per device). A copy between two devices that fails
//! (enabling peer access included) is reported in its cell and, after the report is printed, ends the run with
//! status 1; gather kernels that cannot be loaded on a device (a driver older than their PTX) leave 5 unmeasured,
//! saying why; any other CUDA error ends the run at once, as in the other modes.
//!
//! This file holds the settings and the figures; `measure.rs` runs 1, 2, 3 and 6, `matrix.rs` the matrix,
//! `prefetch.rs` the prefetched gathers, and `report.rs` prints the figures as a table or as the JSON document.
//!
//! [`Pinned`]: cuda_pinned::Pinned
//! [`DeviceBuffer`]: cuda_pinned::DeviceBuffer
//! [`Barrier`]: std::sync::Barrier
//! [`Stream::copy`]: cuda_pinned::Stream::copy
//! [`Prefetcher::sharded`]: cuda_pinned::Prefetcher::sharded
//! [`GatherBatch`]: cuda_pinned::prefetch::GatherBatch
//! [`RowTable`]: cuda_pinned::RowTable
//! [`Placement::DeviceNode`]: cuda_pinned::Placement::DeviceNode

mod matrix;
mod measure;
mod prefetch;
mod report;
#[cfg(test)]
mod tests;

pub use measure::measure;
pub use report::{document, table};

use crate::nvml::Link;
use crate::results::gb_per_s;
use crate::timing::{Plan, Timed};

/// Bytes of each copy of the full run.
pub const FULL_BYTES: usize = 256 << 20;
/// Bytes of each copy with `--quick`.
pub const QUICK_BYTES: usize = 64 << 20;

/// Bytes each device uploads per round of the all-at-once figures: with copies smaller than this, a round is
/// several copies back to back, so that the host's part of a round (waking the threads, synchronizing) stays
/// small beside the copies.
const ROUND_BYTES: usize = 256 << 20;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Whether this is `--quick`.
    pub quick: bool,
    /// Bytes of each copy.
    pub bytes: usize,
    /// How the event-timed figures (per device, and the copy matrix) repeat.
    pub plan: Plan,
    /// Untimed rounds before the all-at-once figures' timed ones.
    pub warmup: usize,
    /// Timed rounds of the all-at-once figures.
    pub rounds: usize,
    /// Bytes of the prefetched gathers' table.
    pub table_bytes: usize,
    /// Batches of the prefetched gathers per device per round.
    pub gather_batches: usize,
    /// Timed rounds of the prefetched gathers, for device 0 alone and again for every device.
    pub gather_rounds: usize,
}

impl Settings {
    /// Copies of 256 MiB, the bandwidth run's full plan and 41 timed rounds (a round is a few milliseconds, and
    /// the medians of 11 moved by a percent or two from run to run); prefetched gathers from a table of
    /// 4 GiB, 128 batches of 32 MiB per device, 5 rounds. With `quick`: 64 MiB, its quick plan and 5; a table of 1
    /// GiB, 16 batches, 3 rounds.
    #[must_use]
    pub fn new(quick: bool) -> Settings {
        Settings {
            quick,
            bytes: if quick { QUICK_BYTES } else { FULL_BYTES },
            plan: if quick { Plan::quick() } else { Plan::full() },
            warmup: 2,
            rounds: if quick { 5 } else { 41 },
            table_bytes: if quick {
                prefetch::QUICK_TABLE_BYTES
            } else {
                prefetch::FULL_TABLE_BYTES
            },
            gather_batches: if quick { 16 } else { 128 },
            gather_rounds: if quick { 3 } else { 5 },
        }
    }

    /// Copies per device per round of the all-at-once figures.
    #[must_use]
    pub fn copies_per_round(&self) -> usize {
        (ROUND_BYTES / self.bytes.max(1)).max(1)
    }
}

/// One event-timed figure: copies of `bytes` on one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// Bytes per copy.
    pub bytes: usize,
    /// The median device time per copy, and how many batches it is taken over.
    pub timed: Timed,
    /// Whether the data arrived intact (checked once, after timing).
    pub verified: bool,
}

impl Figure {
    /// Decimal GB/s of one copy.
    #[must_use]
    pub fn gb_per_s(&self) -> f64 {
        gb_per_s(self.bytes, self.timed.seconds)
    }
}

/// One device: what it is, where it sits, and its copies to and from the host alone.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFigures {
    /// The driver's ordinal.
    pub ordinal: usize,
    /// Such as `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// As `cuDeviceGetPCIBusId` writes it, such as `0000:65:00.0`.
    pub pci_bus_id: String,
    /// The NUMA node the OS puts the device on; `None` where it says none (or cannot be read).
    pub numa_node: Option<u32>,
    /// The NUMA node the library places pinned memory for the device on (`Placement::DeviceNode`); `None`
    /// where it binds none and the OS places it (a host of one node, a device of no node).
    pub pinned_numa_node: Option<u32>,
    /// The PCIe link, read while uploads ran; `None` where NVML could not be read.
    pub pcie: Option<Link>,
    /// Pinned memory to the device.
    pub upload: Figure,
    /// The device to pinned memory.
    pub download: Figure,
}

/// Uploads on several devices at once, timed on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Together {
    /// The devices' ordinals.
    pub devices: Vec<usize>,
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies per device per round.
    pub copies_per_round: usize,
    /// The median wall time of a round, from the barrier's release to the last device's end, seconds.
    pub seconds: f64,
    /// Timed rounds the median is taken over.
    pub rounds: usize,
    /// Whether every device's data arrived intact.
    pub verified: bool,
}

impl Together {
    /// Every device's bytes of a round over the round's time, decimal GB/s.
    #[must_use]
    pub fn gb_per_s(&self) -> f64 {
        gb_per_s(
            self.devices.len() * self.copies_per_round * self.bytes,
            self.seconds,
        )
    }
}

/// The prefetched gathers: device 0 fed alone, then every device at once, by one sharded prefetcher of
/// gathered batches each time.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefetchedGathers {
    /// Every device's ordinal: the feeds of the all-at-once figure.
    pub devices: Vec<usize>,
    /// Bytes of the table the rows are gathered from.
    pub table_bytes: usize,
    /// The NUMA node the table is pinned on (device 0's, as the library places it); `None` where none is bound.
    pub table_numa_node: Option<u32>,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Bytes per batch.
    pub bytes_per_batch: usize,
    /// Batches per device per round.
    pub batches_per_device: usize,
    /// The figures, or why they were not measured (the gather kernels could not be loaded on a device).
    pub result: Result<Fed, String>,
}

/// The times of the prefetched gathers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fed {
    /// The median wall time of a round feeding device 0 alone, seconds.
    pub one_device_seconds: f64,
    /// The same feeding every device at once (with one device, the same figure).
    pub all_devices_seconds: f64,
    /// Timed rounds each median is taken over.
    pub rounds: usize,
    /// Whether one batch per device held the table's rows it names.
    pub verified: bool,
}

impl PrefetchedGathers {
    /// Decimal GB/s fed to device 0 alone; `None` where not measured.
    #[must_use]
    pub fn one_device_gb_per_s(&self) -> Option<f64> {
        let fed = self.result.as_ref().ok()?;
        Some(gb_per_s(
            self.batches_per_device * self.bytes_per_batch,
            fed.one_device_seconds,
        ))
    }

    /// Decimal GB/s fed to every device together; `None` where not measured.
    #[must_use]
    pub fn all_devices_gb_per_s(&self) -> Option<f64> {
        let fed = self.result.as_ref().ok()?;
        Some(gb_per_s(
            self.devices.len() * self.batches_per_device * self.bytes_per_batch,
            fed.all_devices_seconds,
        ))
    }

    /// Every device's GB/s over device 0's alone; `None` where not measured.
    #[must_use]
    pub fn ratio_to_one_device(&self) -> Option<f64> {
        Some(self.all_devices_gb_per_s()? / self.one_device_gb_per_s()?)
    }
}

/// How the copies between two devices went, as [`Stream::copy`] chose: direct where peer access could be enabled
/// both ways, else staged.
///
/// [`Stream::copy`]: cuda_pinned::Stream::copy
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Directly between the two devices' memory, peer access enabled both ways (`cuMemcpyPeerAsync`, over NVLink
    /// or PCIe peer to peer).
    Direct,
    /// Through page-locked memory: the library downloads each chunk on the source's device and uploads it on the
    /// destination's, as the two devices cannot access each other's memory.
    Staged,
}

impl Route {
    /// `direct` or `staged`, as the JSON document writes it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Staged => "staged",
        }
    }
}

/// One cell of the copy matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerCopy {
    /// The device copied from.
    pub src: usize,
    /// The device copied to, whose stream runs the copy.
    pub dst: usize,
    /// Whether the two devices can access each other's memory, each way
    /// ([`Context::can_access_peer`](cuda_pinned::Context::can_access_peer)); `None` on the diagonal, or where
    /// the driver could not say (enabling peer access then fails too, and that error is the cell's).
    pub peer_access: Option<bool>,
    /// How the copies went, decided (peer access enabled) before the first of them; `None` on the diagonal, or
    /// where enabling peer access failed.
    pub route: Option<Route>,
    /// The figure, or the error that stopped the copies (enabling peer access included).
    pub result: Result<Figure, String>,
}

impl PeerCopy {
    /// A copy within one device.
    #[must_use]
    pub fn is_local(&self) -> bool {
        self.src == self.dst
    }

    /// `local` on the diagonal, else `peer`.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        if self.is_local() { "local" } else { "peer" }
    }
}

/// The whole run.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// `--quick` or not.
    pub quick: bool,
    /// Bytes of each copy.
    pub bytes: usize,
    /// The NVIDIA driver release from NVML, such as `580.159.04`, where NVML could be read.
    pub nvidia_driver: Option<String>,
    /// The CUDA version the driver supports, as `cuDriverGetVersion` reports it (`1000 * major + 10 * minor`).
    pub cuda_version: i32,
    /// Where libcuda was loaded from.
    pub driver_library: String,
    /// Every device, in ordinal order.
    pub devices: Vec<DeviceFigures>,
    /// Device 0 uploading alone, timed as the all-at-once figures are.
    pub first_alone: Together,
    /// Every device uploading its own pinned buffer at once.
    pub host_to_all: Together,
    /// Every device uploading one shared pinned buffer at once.
    pub shared_to_all: Together,
    /// The copy matrix, by source then destination.
    pub peer: Vec<PeerCopy>,
    /// The prefetched gathers.
    pub prefetched_gathers: PrefetchedGathers,
    /// Seconds the whole run took.
    pub wall_seconds: f64,
}

impl Figures {
    /// `together`'s GB/s over device 0's alone, timed the same way.
    #[must_use]
    pub fn ratio_to_first(&self, together: &Together) -> f64 {
        together.gb_per_s() / self.first_alone.gb_per_s()
    }

    /// The devices' event-timed uploads alone, added up, GB/s.
    #[must_use]
    pub fn sum_alone(&self) -> f64 {
        self.devices.iter().map(|d| d.upload.gb_per_s()).sum()
    }

    /// The copy matrix's GB/s, `[src][dst]`; `None` where the copy failed.
    #[must_use]
    pub fn matrix(&self) -> Vec<Vec<Option<f64>>> {
        let n = self.devices.len();
        let mut rows = vec![vec![None; n]; n];
        for cell in &self.peer {
            if let (Some(row), Ok(figure)) = (rows.get_mut(cell.src), &cell.result)
                && let Some(slot) = row.get_mut(cell.dst)
            {
                *slot = Some(figure.gb_per_s());
            }
        }
        rows
    }

    /// The figures whose data did not arrive intact.
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for d in &self.devices {
            if !d.upload.verified {
                failures.push(format!("upload to device {}", d.ordinal));
            }
            if !d.download.verified {
                failures.push(format!("download from device {}", d.ordinal));
            }
        }
        for (what, t) in [
            ("device 0 uploading alone", &self.first_alone),
            ("host to all devices", &self.host_to_all),
            ("one shared buffer to all devices", &self.shared_to_all),
        ] {
            if !t.verified {
                failures.push(what.to_string());
            }
        }
        for cell in &self.peer {
            if matches!(&cell.result, Ok(f) if !f.verified) {
                failures.push(format!(
                    "copy from device {} to device {}",
                    cell.src, cell.dst
                ));
            }
        }
        if matches!(&self.prefetched_gathers.result, Ok(fed) if !fed.verified) {
            failures.push("prefetched gathers".to_string());
        }
        failures
    }

    /// The copies of the matrix that failed, each with the driver's or the crate's words.
    #[must_use]
    pub fn errors(&self) -> Vec<String> {
        self.peer
            .iter()
            .filter_map(|cell| {
                cell.result
                    .as_ref()
                    .err()
                    .map(|e| format!("copy from device {} to device {}: {e}", cell.src, cell.dst))
            })
            .collect()
    }
}
