//! The run: per device alone, all devices at once (timed on the host), and what the header says of each device;
//! the copy matrix is `matrix.rs`'s, the prefetched gathers `prefetch.rs`'s.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use cuda_pinned::{Context, Device, DeviceBuffer, Pinned, Placement, Stream, sys};

use super::matrix::matrix;
use super::prefetch::prefetched_gathers;
use super::{DeviceFigures, Figure, Figures, Settings, Together};
use crate::Outcome;
use crate::nvml::{Link, Nvml};
use crate::results::size_label;
use crate::timing::{Plan, Stopwatch, fill_pattern, median, pattern_mismatch};

/// Bytes uploaded while the PCIe link is read: tens of milliseconds of copies, so the link has left its idle
/// speed and is still busy when NVML reads it.
const LOAD_BYTES: usize = 2 << 30;

/// What a download's destination holds before the copy: not the pattern, not zeros.
const POISON: u8 = 0xA5;

/// Runs every measurement on every device.
///
/// # Errors
/// The crate's, from any CUDA call other than the copy matrix's (its copies, and enabling peer access for them:
/// each error is kept in its cell); none of them is a failed data check, which is a figure's `verified`.
pub fn measure(settings: &Settings) -> Outcome<Figures> {
    let started = Instant::now();
    let driver = sys::driver()?;
    let nvml = Nvml::open();
    let devices = Device::all()?;
    if devices.is_empty() {
        return Err("the driver sees no CUDA device: nothing to measure".into());
    }
    let bytes = settings.bytes;
    let mut seeds = Seeds(0x05EE_DDE7_1CE5);

    // Everything is allocated before any figure: pinned memory is unpinned on the crate's release thread once
    // every device is idle, which would stall the copies of a figure running meanwhile.
    let mut units = Vec::with_capacity(devices.len());
    for &device in &devices {
        eprintln!(
            "pinbench devices: device {}: allocating {} of pinned and {} of device memory",
            device.ordinal(),
            size_label(bytes),
            size_label(2 * bytes)
        );
        units.push(Unit::new(device, bytes)?);
    }
    // Portable (the crate's default), so that every device's stream may read it: copies refuse page-locked
    // memory of another context that is not.
    let mut shared = Pinned::<u8>::zeroed(&units[0].context, bytes)?;

    let mut figures = Vec::with_capacity(units.len());
    let mut check = vec![0u8; bytes];
    for unit in &mut units {
        eprintln!(
            "pinbench devices: device {}: uploads and downloads alone",
            unit.ordinal
        );
        let pcie = unit.link_under_load(nvml.as_ref())?;
        let upload = unit.upload(&settings.plan, seeds.next(), &mut check)?;
        let download = unit.download(&settings.plan, seeds.next())?;
        let device = unit.context.device();
        figures.push(DeviceFigures {
            ordinal: unit.ordinal,
            name: device.name()?,
            pci_bus_id: unit.bus_id.clone(),
            numa_node: numa_node(&unit.bus_id),
            pinned_numa_node: Placement::DeviceNode.node(device).map_err(|e| {
                e.context(format_args!(
                    "the NUMA node pinned memory for device {} is placed on",
                    unit.ordinal
                ))
            })?,
            pcie,
            upload,
            download,
        });
    }
    drop(check);

    eprintln!("pinbench devices: device 0 alone, timed on the host");
    let first_alone = {
        let unit = &mut units[0];
        let seed = seeds.next();
        fill_pattern(unit.host.as_mut_slice()?, seed);
        together(
            vec![Job {
                stream: &unit.stream,
                src: &unit.host,
                dst: &mut unit.target,
                seed,
            }],
            settings,
        )?
    };
    let host_to_all = if units.len() == 1 {
        // One device at once is device 0 alone: the same figure, not a second measurement of it.
        first_alone.clone()
    } else {
        eprintln!(
            "pinbench devices: all {} devices at once, each from its own pinned memory",
            units.len()
        );
        let mut jobs = Vec::with_capacity(units.len());
        for unit in &mut units {
            let seed = seeds.next();
            fill_pattern(unit.host.as_mut_slice()?, seed);
            jobs.push(Job {
                stream: &unit.stream,
                src: &unit.host,
                dst: &mut unit.target,
                seed,
            });
        }
        together(jobs, settings)?
    };
    eprintln!(
        "pinbench devices: all {} device(s) at once from one shared pinned buffer",
        units.len()
    );
    let shared_to_all = {
        let seed = seeds.next();
        fill_pattern(shared.as_mut_slice()?, seed);
        let shared = &shared;
        let jobs = units
            .iter_mut()
            .map(|unit| Job {
                stream: &unit.stream,
                src: shared,
                dst: &mut unit.target,
                seed,
            })
            .collect();
        together(jobs, settings)?
    };

    let peer = matrix(&mut units, settings, &mut seeds)?;
    for unit in &units {
        unit.stream.synchronize()?;
    }
    let contexts: Vec<Context> = units.iter().map(|u| u.context.clone()).collect();

    // Before anything is freed: unpinning waits for every device to be idle.
    let prefetched_gathers = prefetched_gathers(&contexts, settings, &mut seeds)?;

    drop(units);
    drop(shared);
    for context in &contexts {
        // Waits for the release thread to unpin and free what the run used, and reports what it could not.
        context.synchronize()?;
        context.check_deferred_errors()?;
    }

    Ok(Figures {
        quick: settings.quick,
        bytes,
        nvidia_driver: nvml.as_ref().and_then(Nvml::driver_release),
        cuda_version: driver.version(),
        driver_library: driver.path().to_string(),
        devices: figures,
        first_alone,
        host_to_all,
        shared_to_all,
        peer,
        prefetched_gathers,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

/// Fresh seeds for the data pattern, so that data left over from an earlier copy never passes a check.
pub(super) struct Seeds(u64);

impl Seeds {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x2545_F491_4F6C_DD1D);
        self.0
    }
}

/// One device's context, stream and buffers.
pub(super) struct Unit {
    ordinal: usize,
    bus_id: String,
    pub(super) context: Context,
    pub(super) stream: Stream,
    pub(super) watch: Stopwatch,
    /// The device's own pinned memory, allocated in its context.
    pub(super) host: Pinned<u8>,
    /// What uploads write, and the matrix's copies into this device.
    pub(super) target: DeviceBuffer<u8>,
    /// What the matrix copies from this device.
    pub(super) source: DeviceBuffer<u8>,
}

impl Unit {
    fn new(device: Device, bytes: usize) -> Outcome<Unit> {
        let context = Context::new(device)?;
        let stream = Stream::new(&context)?;
        Ok(Unit {
            ordinal: device.ordinal(),
            bus_id: device.pci_bus_id()?,
            watch: Stopwatch::new(&stream)?,
            host: Pinned::zeroed(&context, bytes)?,
            target: DeviceBuffer::zeroed(&stream, bytes)?,
            source: DeviceBuffer::zeroed(&stream, bytes)?,
            context,
            stream,
        })
    }

    /// Reads the PCIe link while uploads keep it busy (an idle link drops to a slower generation); also warms
    /// the copies up.
    fn link_under_load(&mut self, nvml: Option<&Nvml>) -> Outcome<Option<Link>> {
        for _ in 0..(LOAD_BYTES / self.host.len().max(1)).max(1) {
            self.stream.upload(&self.host, &mut self.target)?;
        }
        let link = nvml.and_then(|n| n.pcie_link(&self.bus_id));
        self.stream.synchronize()?;
        Ok(link)
    }

    /// Times uploads of the pinned memory, then checks what arrived through `check`.
    fn upload(&mut self, plan: &Plan, seed: u64, check: &mut [u8]) -> Outcome<Figure> {
        fill_pattern(self.host.as_mut_slice()?, seed);
        let (stream, host, target) = (&self.stream, &self.host, &mut self.target);
        let timed = self
            .watch
            .copies(plan, || Ok(stream.upload(host, target)?))?;
        stream.download_pageable(target, check)?;
        Ok(Figure {
            bytes: host.len(),
            timed,
            verified: pattern_mismatch(check, seed).is_none(),
        })
    }

    /// Times downloads into the pinned memory (overwritten first, so a copy that did nothing shows), then
    /// checks what arrived.
    fn download(&mut self, plan: &Plan, seed: u64) -> Outcome<Figure> {
        fill_pattern(self.host.as_mut_slice()?, seed);
        self.stream.upload(&self.host, &mut self.target)?;
        self.host.as_mut_slice()?.fill(POISON);
        let (stream, host, target) = (&self.stream, &mut self.host, &self.target);
        let timed = self
            .watch
            .copies(plan, || Ok(stream.download(target, host)?))?;
        Ok(Figure {
            bytes: host.len(),
            timed,
            verified: pattern_mismatch(host.as_slice()?, seed).is_none(),
        })
    }
}

/// One device's part of an all-at-once figure: uploads of `src` (filled with the pattern for `seed`) into
/// `dst` on `stream`.
struct Job<'a> {
    stream: &'a Stream,
    src: &'a Pinned<u8>,
    dst: &'a mut DeviceBuffer<u8>,
    seed: u64,
}

/// The host's view of one round of one device: when its thread left the barrier and when its stream was done,
/// seconds from a common origin.
type Span = (f64, f64);

/// What one thread brings back: its rounds and whether its data arrived intact, or what failed.
type JobResult = Result<(Vec<Span>, bool), String>;

impl Job<'_> {
    /// Runs `rounds` rounds of `copies` uploads each, every round started with the other threads at `barrier`;
    /// then checks the data. A thread whose copy fails says so through `failed`, and every thread stops after
    /// that round, so none is left waiting at the barrier.
    fn run(
        mut self,
        barrier: &Barrier,
        failed: &AtomicBool,
        origin: Instant,
        rounds: usize,
        copies: usize,
    ) -> JobResult {
        let mut spans = Vec::with_capacity(rounds);
        let mut error = None;
        for _ in 0..rounds {
            barrier.wait();
            let start = origin.elapsed().as_secs_f64();
            if let Err(e) = self.round(copies) {
                error = Some(e.to_string());
                failed.store(true, Ordering::SeqCst);
            }
            spans.push((start, origin.elapsed().as_secs_f64()));
            // Every thread reads `failed` after this second barrier, and none writes it until the next round
            // begins, so all of them see the same value and stop at the same round.
            barrier.wait();
            if failed.load(Ordering::SeqCst) {
                break;
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        let mut check = vec![0u8; self.dst.len()];
        self.stream
            .download_pageable(&*self.dst, &mut check)
            .map_err(|e| e.to_string())?;
        Ok((spans, pattern_mismatch(&check, self.seed).is_none()))
    }

    fn round(&mut self, copies: usize) -> cuda_pinned::Result<()> {
        for _ in 0..copies {
            self.stream.upload(self.src, self.dst)?;
        }
        self.stream.synchronize()
    }
}

/// Runs `jobs` together, one thread each, for the settings' warm-up and timed rounds.
fn together(jobs: Vec<Job<'_>>, settings: &Settings) -> Outcome<Together> {
    let devices: Vec<usize> = jobs
        .iter()
        .map(|j| j.stream.context().device().ordinal())
        .collect();
    let copies = settings.copies_per_round();
    let rounds = settings.warmup + settings.rounds;
    let barrier = Barrier::new(jobs.len());
    let failed = AtomicBool::new(false);
    let origin = Instant::now();
    let results: Vec<JobResult> = std::thread::scope(|scope| {
        let threads: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let (barrier, failed) = (&barrier, &failed);
                scope.spawn(move || job.run(barrier, failed, origin, rounds, copies))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a copying thread panicked".to_string()))
            })
            .collect()
    });
    let mut per_thread = Vec::with_capacity(results.len());
    let mut verified = true;
    for result in results {
        let (spans, ok) = result?;
        per_thread.push(spans);
        verified &= ok;
    }
    let spans = round_spans(&per_thread, settings.warmup);
    Ok(Together {
        devices,
        bytes: settings.bytes,
        copies_per_round: copies,
        rounds: spans.len(),
        seconds: median(spans),
        verified,
    })
}

/// The wall time of each round after the first `warmup`: from the earliest start of any thread to the latest
/// end. `per_thread[t][r]` is thread `t`'s span of round `r`; a round some thread lacks is left out.
pub(super) fn round_spans(per_thread: &[Vec<Span>], warmup: usize) -> Vec<f64> {
    let rounds = per_thread.iter().map(Vec::len).min().unwrap_or(0);
    (warmup..rounds)
        .map(|r| {
            let start = per_thread
                .iter()
                .map(|t| t[r].0)
                .fold(f64::INFINITY, f64::min);
            let end = per_thread
                .iter()
                .map(|t| t[r].1)
                .fold(f64::NEG_INFINITY, f64::max);
            end - start
        })
        .collect()
}

/// The NUMA node of the PCI device at `bus_id`, as the OS gives it in sysfs; `None` where it gives none (-1, a
/// host of one node) or the file cannot be read (not Linux, a VM without it).
fn numa_node(bus_id: &str) -> Option<u32> {
    let path = format!("/sys/bus/pci/devices/{}/numa_node", sysfs_bus_id(bus_id));
    parse_numa_node(&std::fs::read_to_string(path).ok()?)
}

/// The name sysfs gives a PCI address: lower case, a domain of at least 4 hex digits (`cuDeviceGetPCIBusId`
/// writes `0000:65:00.0`, NVML `00000000:65:00.0`).
pub(super) fn sysfs_bus_id(bus_id: &str) -> String {
    let bus_id = bus_id.trim().to_ascii_lowercase();
    match bus_id.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(domain) => format!("{domain:04x}:{rest}"),
            Err(_) => bus_id,
        },
        None => bus_id,
    }
}

/// A `numa_node` file's content: a node number, or -1 for none.
pub(super) fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}
