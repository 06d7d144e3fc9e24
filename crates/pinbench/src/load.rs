//! `pinbench load`: a safetensors checkpoint from a file into device memory, cold (its pages dropped from the
//! page cache) and warm (the file read just before), by the crate's loader (`Stream::load_file` of the whole
//! file, and `SafeTensorsFile::open` + `load`), against what the file system alone delivers (the ceiling:
//! positional reads on as many threads as the loader reads with, into page-aligned buffers of its slot size;
//! direct reads cold, buffered warm), the driver's pageable path (the file read into a `Vec`, or mapped, then
//! `upload_pageable`), and the two steps a warm load cannot beat: copying memory into pinned memory on every
//! core, and a pinned upload.
//!
//! Every figure is one run, timed on the host from the call to the data being on the device (the stream
//! synchronized), as GB/s of the bytes loaded. The page cache's state is asked, not assumed: `mincore` says
//! what fraction of the file it held just before each figure, and a figure whose state was not the one asked
//! for (a file system that keeps the pages, as tmpfs does) says so. Each load goes into a fresh zeroed device
//! buffer and is checked against the file's bytes. `load/disk.rs` holds the file side: writing the file,
//! emptying and filling the cache, the ceiling's reads, the mapping, the file system and disk.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cuda_pinned::load::SafeTensorsFile;
use cuda_pinned::{Context, DeviceBuffer, Io, LoadOptions, LoadReport, Pinned, PinnedPool, Stream};
use serde::Serialize;

use self::disk::{Existing, Layout, Mapped, Storage};
use crate::results::size_label;
use crate::timing::{Stopwatch, fill_pattern, median};
use crate::{Outcome, cli};

mod disk;
mod report;

pub use self::report::{document, table};

const GIB: usize = 1 << 30;
/// The file's name, in the temporary directory or the directory `--path` names.
pub const FILE_NAME: &str = "pinbench-load.safetensors";
/// Bytes of tensors on the simulated driver, without `--gib`: its device memory is host memory.
const SIMULATED_BYTES: usize = 64 << 20;
/// Bytes of the references (host copy into pinned memory, pinned upload); on the simulated driver, fewer.
const REFERENCE_BYTES: usize = GIB;
const SIMULATED_REFERENCE_BYTES: usize = 16 << 20;
/// Timed repetitions of each reference, after one untimed.
const REFERENCE_SAMPLES: usize = 5;
/// The pool's budget: room for the sweep's largest slots (17 of 64 MiB), pinned only as loads take them.
pub const POOL_BUDGET: usize = 1100 << 20;
/// The sweep's readers (direct, cold; buffered, warm) and slot sizes.
pub const SWEEP_READERS: [usize; 4] = [1, 2, 4, 8];
pub const SWEEP_BUFFERED_READERS: [usize; 4] = [4, 8, 12, 16];
/// Cold loads made to read through the page cache (as a buffered reader with readahead does): these readers, in
/// slots of 16 MiB.
pub const SWEEP_COLD_BUFFERED_READERS: [usize; 3] = [4, 8, 16];
pub const SWEEP_SLOTS: [usize; 3] = [4 << 20, 16 << 20, 64 << 20];
/// A figure is cold where the page cache held at most this fraction of the file, warm where at least this.
pub const COLD_AT_MOST: f64 = 0.05;
pub const WARM_AT_LEAST: f64 = 0.95;
/// The goals: a cold load at this fraction of the disk's ceiling, a warm one at this fraction of the slower of
/// the host copy into pinned memory and the pinned upload.
pub const COLD_GOAL: f64 = 0.90;
pub const WARM_GOAL: f64 = 0.85;
/// The check: this many evenly spaced pieces of this size, plus the first and the last.
const PIECES: usize = 64;
const PIECE: usize = 1 << 20;
/// Reads of the warm-up read that fills the page cache.
const WARM_CHUNK: usize = 16 << 20;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub quick: bool,
    /// Bytes of tensors.
    pub data_bytes: usize,
    pub path: PathBuf,
    pub keep: bool,
    pub sweep: bool,
    pub reference_bytes: usize,
    /// Threads of the host copy, the writing and the warm-up reads: the CPU's cores.
    pub threads: usize,
}

impl Settings {
    /// `--gib` GiB of tensors, else 8 (1 with `quick`; 64 MiB on the simulated driver), in the file `--path`
    /// names (or [`FILE_NAME`] in the directory it names, or in the temporary directory).
    #[must_use]
    pub fn new(options: &cli::LoadOptions, simulated: bool) -> Settings {
        let data_bytes = match options.data_bytes {
            Some(bytes) => bytes,
            None if simulated => SIMULATED_BYTES,
            None if options.quick => GIB,
            None => 8 * GIB,
        };
        let path = match &options.path {
            Some(path) if path.is_dir() => path.join(FILE_NAME),
            Some(path) => path.clone(),
            None => std::env::temp_dir().join(FILE_NAME),
        };
        Settings {
            quick: options.quick,
            data_bytes,
            path,
            keep: options.keep,
            sweep: options.sweep,
            reference_bytes: if simulated {
                SIMULATED_REFERENCE_BYTES
            } else {
                REFERENCE_BYTES
            },
            threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
        }
    }
}

/// The page cache's state a figure is measured in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cache {
    Cold,
    Warm,
}

impl Cache {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Cache::Cold => "cold",
            Cache::Warm => "warm",
        }
    }

    /// Whether the page cache holding `resident` of the file is this state.
    fn reached(self, resident: f64) -> bool {
        match self {
            Cache::Cold => resident <= COLD_AT_MOST,
            Cache::Warm => resident >= WARM_AT_LEAST,
        }
    }
}

/// One figure: one run of one way, in one state of the page cache.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// Bytes put on the device (for the ceiling: read).
    pub bytes: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
    /// Over the ceiling of the same state of the page cache.
    pub ratio_to_ceiling: f64,
    /// Over the pinned upload reference.
    pub ratio_to_pinned_upload: f64,
    /// The fraction of the file's pages in the page cache just before (`mincore`).
    pub resident_before: f64,
    /// Whether that is the state asked for (cold: at most 5%, warm: at least 95%).
    pub cache_state_reached: bool,
    /// Whether the file was read with `O_DIRECT`; why not, where not.
    pub direct: bool,
    pub why_buffered: Option<String>,
    /// What the loader said it did (the crate's loads only).
    pub loader: Option<Loader>,
    /// Whether the device memory holds the file's bytes (`checked` says which); `null` for the ceiling, which
    /// puts nothing on the device.
    pub verified: Option<bool>,
}

/// A [`LoadReport`], as the document shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Loader {
    pub readers: usize,
    pub slot_bytes: usize,
    pub slots: usize,
    /// The most page-locked memory the load held: `slots * slot_bytes`.
    pub pinned_bytes: usize,
    /// Bytes read from the file (direct reads read whole blocks).
    pub read_bytes: u64,
    /// From the call to its return: every byte read, the last uploads perhaps still running.
    pub returned_seconds: f64,
}

impl Loader {
    fn of(report: &LoadReport) -> Loader {
        Loader {
            readers: report.readers,
            slot_bytes: report.slot_bytes,
            slots: report.slots,
            pinned_bytes: report.slots * report.slot_bytes,
            read_bytes: report.read,
            returned_seconds: report.elapsed.as_secs_f64(),
        }
    }
}

/// Every way in one state of the page cache.
#[derive(Debug, Clone, Serialize)]
pub struct State {
    pub cache: Cache,
    /// Reads alone: direct cold (the disk's ceiling), buffered warm (the page cache's).
    pub ceiling: Figure,
    /// `Stream::load_file` of the whole file into one device buffer, default options.
    pub load_file: Figure,
    /// `SafeTensorsFile::open` + `load`: the tensors' bytes.
    pub safetensors: Figure,
    /// `std::fs::read` into a `Vec`, then `Stream::upload_pageable`.
    pub pageable: Figure,
    /// `mmap` of the file, then `Stream::upload_pageable` of the mapping.
    pub mmap: Figure,
}

impl State {
    fn figures(&self) -> [(&'static str, &Figure); 5] {
        [
            ("ceiling", &self.ceiling),
            ("load_file", &self.load_file),
            ("safetensors", &self.safetensors),
            ("pageable", &self.pageable),
            ("mmap", &self.mmap),
        ]
    }
}

/// What a warm load cannot beat: copying warm memory into pinned memory, and uploading pinned memory.
#[derive(Debug, Clone, Serialize)]
pub struct References {
    pub bytes: usize,
    /// Threads of the host copy: the CPU's cores.
    pub threads: usize,
    pub samples: usize,
    /// A `Vec` copied into a `Pinned` on `threads` threads: host wall time, median.
    pub host_copy_into_pinned_gb_per_s: f64,
    pub host_copy_into_pinned_seconds: f64,
    /// `Stream::upload` from a `Pinned`: device time from CUDA events, median.
    pub pinned_upload_gb_per_s: f64,
    pub pinned_upload_seconds: f64,
    pub verified: bool,
}

/// A goal: a ratio, the least it should be, and whether it is (`null` where the figures were not measured in
/// the state the goal is about).
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub ratio: f64,
    pub goal: f64,
    pub met: Option<bool>,
    pub note: Option<String>,
}

/// One load of the sweep: `Stream::load_file_with` of `readers` (direct cold, buffered warm) and slots of
/// `slot_bytes`.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    pub cache: Cache,
    /// Whether the loads were made to read through the page cache (`Io::Buffered`) when cold.
    pub forced_buffered: bool,
    pub readers: usize,
    pub slot_bytes: usize,
    #[serde(flatten)]
    pub figure: Figure,
}

/// The file.
#[derive(Debug, Clone, Serialize)]
pub struct FileInfo {
    pub path: String,
    pub bytes: u64,
    /// Where the tensors start, and their bytes.
    pub data_start: u64,
    pub data_bytes: usize,
    pub tensors: usize,
    pub tensor_bytes: usize,
    pub dtype: &'static str,
    /// Written by this run (else reused: a file of the same layout that an earlier run kept).
    pub written: bool,
    pub write_seconds: Option<f64>,
    /// Kept at the end (`--keep`); else removed.
    pub kept: bool,
    pub storage: Storage,
}

/// The loader's default options.
#[derive(Debug, Clone, Serialize)]
pub struct Defaults {
    pub readers: usize,
    pub buffered_readers: usize,
    pub slot_bytes: usize,
    pub slots: usize,
    pub pinned_bytes: usize,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub device: String,
    pub quick: bool,
    pub wall_seconds: f64,
    pub file: FileInfo,
    pub loader_defaults: Defaults,
    pub pool_budget_bytes: usize,
    pub references: References,
    pub cold: State,
    pub warm: State,
    /// Cold `load_file` over the cold ceiling.
    pub cold_goal: Goal,
    /// Warm `load_file` over the slower of the two references.
    pub warm_goal: Goal,
    /// What each load's check compares.
    pub checked: String,
    /// `--sweep`'s loads; `null` without it.
    pub sweep: Option<Vec<SweepPoint>>,
}

impl Figures {
    /// The figures whose data did not arrive intact.
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        let mut failed: Vec<String> = [&self.cold, &self.warm]
            .into_iter()
            .flat_map(|s| {
                s.figures()
                    .into_iter()
                    .filter(|(_, f)| f.verified == Some(false))
                    .map(move |(name, _)| format!("{} {name}", s.cache.name()))
            })
            .collect();
        if !self.references.verified {
            failed.push("the references' copies".into());
        }
        for p in self.sweep.iter().flatten() {
            if p.figure.verified == Some(false) {
                failed.push(format!(
                    "the sweep's load of {} readers x {}",
                    p.readers,
                    size_label(p.slot_bytes)
                ));
            }
        }
        failed
    }
}

/// The byte ranges of a load of `len` bytes its check compares: all of them in pieces of [`PIECE`] where they
/// are few, else the first and the last piece and [`PIECES`] evenly spaced between.
#[must_use]
pub fn sample_ranges(len: usize) -> Vec<Range<usize>> {
    if len <= (PIECES + 2) * PIECE {
        return (0..len)
            .step_by(PIECE)
            .map(|s| s..(s + PIECE).min(len))
            .collect();
    }
    (0..=PIECES + 1)
        .map(|k| {
            let start = k * (len - PIECE) / (PIECES + 1);
            start..start + PIECE
        })
        .collect()
}

/// Removes the file when dropped, unless it is to be kept: at the end of the run, or at an error.
struct Removal<'a> {
    path: &'a Path,
    keep: bool,
}

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(self.path);
        }
    }
}

/// Runs every measurement on device 0.
///
/// # Errors
/// The crate's; the system's, about the file; a file at the path that this mode did not write.
pub fn measure(settings: &Settings) -> Outcome<Figures> {
    let started = Instant::now();
    let layout = Layout::new(settings.data_bytes);
    let path = settings.path.as_path();
    let reused = match disk::existing(path, &layout) {
        Existing::Foreign(why) => {
            return Err(format!(
                "{} exists and is not a file that pinbench load wrote ({why}): remove it, or name another \
                 file with --path",
                path.display()
            )
            .into());
        }
        Existing::Ours { reusable } => reusable,
        Existing::Missing => false,
    };
    let _removal = Removal {
        path,
        keep: settings.keep,
    };
    let write_seconds = if reused {
        eprintln!("pinbench load: reusing {}", path.display());
        None
    } else {
        eprintln!(
            "pinbench load: writing {} of tensors to {}",
            human(layout.data_bytes as u64),
            path.display()
        );
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        Some(disk::write(path, &layout, seed, settings.threads)?)
    };
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let pool = PinnedPool::new(&context, POOL_BUDGET);
    let defaults = LoadOptions::default();
    eprintln!("pinbench load: the references");
    let references = references(&context, &stream, settings)?;
    let mut run = Run {
        stream: &stream,
        pool: &pool,
        path,
        file: File::open(path)?,
        layout,
        threads: settings.threads,
        ceilings: [f64::NAN; 2],
        pinned_upload: references.pinned_upload_gb_per_s,
    };
    let cold = run.state(Cache::Cold)?;
    let warm = run.state(Cache::Warm)?;
    let sweep = if settings.sweep {
        let mut points = Vec::new();
        for (cache, counts) in [
            (Cache::Cold, SWEEP_READERS),
            (Cache::Warm, SWEEP_BUFFERED_READERS),
        ] {
            for readers in counts {
                for slot_bytes in SWEEP_SLOTS {
                    let options = LoadOptions::default()
                        .readers(readers)
                        .buffered_readers(readers)
                        .slot_bytes(slot_bytes);
                    eprintln!(
                        "pinbench load: sweep: {}, {readers} readers x {}",
                        cache.name(),
                        size_label(slot_bytes)
                    );
                    let figure = run.load_file(cache, options)?;
                    points.push(SweepPoint {
                        cache,
                        forced_buffered: false,
                        readers,
                        slot_bytes,
                        figure,
                    });
                }
            }
        }
        for readers in SWEEP_COLD_BUFFERED_READERS {
            let options = LoadOptions::default()
                .buffered_readers(readers)
                .slot_bytes(16 << 20)
                .io(Io::Buffered);
            eprintln!("pinbench load: sweep: cold, {readers} buffered readers x 16 MiB");
            let figure = run.load_file(Cache::Cold, options)?;
            points.push(SweepPoint {
                cache: Cache::Cold,
                forced_buffered: true,
                readers,
                slot_bytes: 16 << 20,
                figure,
            });
        }
        Some(points)
    } else {
        None
    };
    let reference = references
        .host_copy_into_pinned_gb_per_s
        .min(references.pinned_upload_gb_per_s);
    let cold_goal = goal(&cold, cold.ceiling.gb_per_s, COLD_GOAL);
    let warm_goal = goal(&warm, reference, WARM_GOAL);
    let whole =
        sample_ranges(layout.file_bytes() as usize).len() * PIECE >= layout.file_bytes() as usize;
    Ok(Figures {
        device: context.device().name()?,
        quick: settings.quick,
        wall_seconds: started.elapsed().as_secs_f64(),
        file: FileInfo {
            path: path.display().to_string(),
            bytes: layout.file_bytes(),
            data_start: layout.data_start(),
            data_bytes: layout.data_bytes,
            tensors: layout.tensors,
            tensor_bytes: layout.tensor_bytes,
            dtype: "BF16",
            written: !reused,
            write_seconds,
            kept: settings.keep,
            storage: disk::storage(path),
        },
        loader_defaults: Defaults {
            readers: defaults.readers,
            buffered_readers: defaults.buffered_readers,
            slot_bytes: defaults.slot_bytes,
            slots: defaults.most_slots(),
            pinned_bytes: defaults.most_slots() * defaults.slot_bytes,
        },
        pool_budget_bytes: POOL_BUDGET,
        references,
        cold,
        warm,
        cold_goal,
        warm_goal,
        checked: format!(
            "each load's device buffer (fresh and zeroed) against the file's bytes read back with pread: {}",
            if whole {
                "every byte, in pieces of 1 MiB".to_owned()
            } else {
                format!("{PIECES} evenly spaced pieces of 1 MiB plus the first and the last MiB")
            }
        ),
        sweep,
    })
}

/// `state`'s `load_file` over `against` GB/s, judged where it and the state's ceiling were measured in the
/// state asked for.
fn goal(state: &State, against: f64, goal: f64) -> Goal {
    let (load, ceiling) = (&state.load_file, &state.ceiling);
    let ratio = load.gb_per_s / against;
    let reached = load.cache_state_reached && ceiling.cache_state_reached;
    Goal {
        ratio,
        goal,
        met: reached.then_some(ratio >= goal),
        note: (!reached).then(|| {
            format!(
                "not judged: not {} (the page cache held {:.0}% of the file before the load, {:.0}% before the \
                 ceiling)",
                state.cache.name(),
                load.resident_before * 100.0,
                ceiling.resident_before * 100.0
            )
        }),
    }
}

/// The references: a warm `Vec` copied into pinned memory on every core, and a pinned upload.
fn references(context: &Context, stream: &Stream, settings: &Settings) -> Outcome<References> {
    let bytes = settings.reference_bytes;
    let mut source = vec![0u8; bytes];
    fill_pattern(&mut source, 0x10AD);
    let mut pinned = Pinned::<u8>::zeroed(context, bytes)?;
    let mut copies = Vec::new();
    for _ in 0..=REFERENCE_SAMPLES {
        let target = pinned.as_mut_slice()?;
        let began = Instant::now();
        let per = bytes.div_ceil(settings.threads).max(1);
        std::thread::scope(|scope| {
            for (to, from) in target.chunks_mut(per).zip(source.chunks(per)) {
                scope.spawn(move || to.copy_from_slice(from));
            }
        });
        copies.push(began.elapsed().as_secs_f64());
    }
    let mut verified = pinned.as_slice()? == &source[..];
    let mut device = DeviceBuffer::<u8>::zeroed(stream, bytes)?;
    let watch = Stopwatch::new(stream)?;
    let mut uploads = Vec::new();
    for _ in 0..=REFERENCE_SAMPLES {
        uploads.push(watch.time(|| Ok(stream.upload(&pinned, &mut device)?))?);
    }
    for range in sample_ranges(bytes) {
        let mut got = vec![0u8; range.len()];
        stream.download_pageable(&device.slice(range.clone())?, &mut got)?;
        verified &= got == source[range];
    }
    let (copy, upload) = (median(copies[1..].to_vec()), median(uploads[1..].to_vec()));
    Ok(References {
        bytes,
        threads: settings.threads,
        samples: REFERENCE_SAMPLES,
        host_copy_into_pinned_gb_per_s: bytes as f64 / copy / 1e9,
        host_copy_into_pinned_seconds: copy,
        pinned_upload_gb_per_s: bytes as f64 / upload / 1e9,
        pinned_upload_seconds: upload,
        verified,
    })
}

/// What every figure needs.
struct Run<'a> {
    stream: &'a Stream,
    pool: &'a PinnedPool,
    path: &'a Path,
    /// The file, open for the residency question and the checks' reads.
    file: File,
    layout: Layout,
    threads: usize,
    /// GB/s of the cold and the warm ceiling, once measured.
    ceilings: [f64; 2],
    pinned_upload: f64,
}

impl Run<'_> {
    /// Every way in the page cache's state `cache`.
    fn state(&mut self, cache: Cache) -> Outcome<State> {
        let defaults = LoadOptions::default();
        let step = |what: &str| eprintln!("pinbench load: {}: {what}", cache.name());
        step("the ceiling");
        let ceiling = self.ceiling(cache, defaults)?;
        self.ceilings[cache as usize] = ceiling.gb_per_s;
        let ceiling = Figure {
            ratio_to_ceiling: 1.0,
            ..ceiling
        };
        step("Stream::load_file");
        let load_file = self.load_file(cache, defaults)?;
        step("SafeTensorsFile::open + load");
        let safetensors = self.safetensors(cache)?;
        step("std::fs::read + upload_pageable");
        let pageable = self.pageable(cache, false)?;
        step("mmap + upload_pageable");
        let mmap = self.pageable(cache, true)?;
        Ok(State {
            cache,
            ceiling,
            load_file,
            safetensors,
            pageable,
            mmap,
        })
    }

    /// Empties the page cache of the file (cold) or reads the file through it (warm); then the fraction of the
    /// file it holds.
    fn prepare(&self, cache: Cache) -> Outcome<f64> {
        match cache {
            Cache::Cold => disk::drop_cached(self.path)?,
            Cache::Warm => {
                disk::read_all(self.path, false, self.threads, WARM_CHUNK)?;
            }
        }
        disk::resident_fraction(&self.file)
    }

    /// A figure of `bytes` in `seconds`, its ratios to this state's ceiling and the pinned upload.
    #[allow(clippy::too_many_arguments)]
    fn figure(
        &self,
        cache: Cache,
        bytes: u64,
        seconds: f64,
        resident: f64,
        (direct, why_buffered): (bool, Option<String>),
        loader: Option<Loader>,
        verified: Option<bool>,
    ) -> Figure {
        let gb_per_s = bytes as f64 / seconds / 1e9;
        Figure {
            bytes,
            seconds,
            gb_per_s,
            ratio_to_ceiling: gb_per_s / self.ceilings[cache as usize],
            ratio_to_pinned_upload: gb_per_s / self.pinned_upload,
            resident_before: resident,
            cache_state_reached: cache.reached(resident),
            direct,
            why_buffered,
            loader,
            verified,
        }
    }

    /// Reads alone with the loader's readers and slot size: direct cold, buffered warm.
    fn ceiling(&self, cache: Cache, options: LoadOptions) -> Outcome<Figure> {
        let resident = self.prepare(cache)?;
        let reads = disk::read_all(
            self.path,
            cache == Cache::Cold,
            if cache == Cache::Cold {
                options.readers
            } else {
                options.buffered_readers
            },
            options.slot_bytes,
        )?;
        let how = (reads.direct, reads.why_buffered);
        Ok(self.figure(cache, reads.bytes, reads.seconds, resident, how, None, None))
    }

    /// A fresh device buffer of `bytes`, zeroed (so that bytes an earlier load left cannot pass a check), the
    /// zeroing done.
    fn fresh(&self, bytes: usize) -> Outcome<DeviceBuffer<u8>> {
        let buffer = DeviceBuffer::<u8>::zeroed(self.stream, bytes)?;
        self.stream.synchronize()?;
        Ok(buffer)
    }

    /// `Stream::load_file_with` of the whole file with `options`.
    fn load_file(&self, cache: Cache, options: LoadOptions) -> Outcome<Figure> {
        warm_pool(self.pool, options)?;
        let len = self.layout.file_bytes();
        let mut device = self.fresh(len as usize)?;
        let resident = self.prepare(cache)?;
        let began = Instant::now();
        let report = self
            .stream
            .load_file_with(self.pool, options, self.path, 0, &mut device)?;
        self.stream.synchronize()?;
        let seconds = began.elapsed().as_secs_f64();
        let verified = self.verify(&device, 0)?;
        let how = (report.direct, report.why_buffered.clone());
        let loader = Some(Loader::of(&report));
        Ok(self.figure(cache, len, seconds, resident, how, loader, Some(verified)))
    }

    /// `SafeTensorsFile::open` + `load` (default options): every tensor, in one device buffer it allocates.
    fn safetensors(&self, cache: Cache) -> Outcome<Figure> {
        warm_pool(self.pool, LoadOptions::default())?;
        let resident = self.prepare(cache)?;
        let began = Instant::now();
        let tensors = SafeTensorsFile::open(self.path)?.load(self.stream, self.pool)?;
        self.stream.synchronize()?;
        let seconds = began.elapsed().as_secs_f64();
        let verified = tensors.len() == self.layout.tensors
            && self.verify(tensors.buffer(), self.layout.data_start())?;
        let report = tensors.report();
        let how = (report.direct, report.why_buffered.clone());
        let (bytes, loader) = (report.bytes, Some(Loader::of(report)));
        Ok(self.figure(cache, bytes, seconds, resident, how, loader, Some(verified)))
    }

    /// The driver's pageable path: the file read into a `Vec` (`std::fs::read`), or mapped (`mapped`), then
    /// `Stream::upload_pageable`.
    fn pageable(&self, cache: Cache, mapped: bool) -> Outcome<Figure> {
        let len = self.layout.file_bytes() as usize;
        let mut device = self.fresh(len)?;
        let resident = self.prepare(cache)?;
        let began = Instant::now();
        let (seconds, how) = if mapped {
            let map = Mapped::new(&self.file, len)?;
            self.stream.upload_pageable(map.as_slice(), &mut device)?;
            (began.elapsed(), "mapped: read by page faults")
        } else {
            let bytes = std::fs::read(self.path)?;
            self.stream.upload_pageable(&bytes, &mut device)?;
            (began.elapsed(), "std::fs::read")
        };
        let verified = self.verify(&device, 0)?;
        let how = (false, Some(how.to_owned()));
        Ok(self.figure(
            cache,
            len as u64,
            seconds.as_secs_f64(),
            resident,
            how,
            None,
            Some(verified),
        ))
    }

    /// Whether `device` holds the file's bytes from `offset` at [`sample_ranges`].
    fn verify(&self, device: &DeviceBuffer<u8>, offset: u64) -> Outcome<bool> {
        for range in sample_ranges(device.len()) {
            let (mut got, mut want) = (vec![0u8; range.len()], vec![1u8; range.len()]);
            self.stream
                .download_pageable(&device.slice(range.clone())?, &mut got)?;
            self.file
                .read_exact_at(&mut want, offset + range.start as u64)?;
            if got != want {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Pins the slots a load of `options` takes, so that no figure times pinning (a process that loads more than
/// once has them pinned after the first): the pool keeps them once given back.
fn warm_pool(pool: &PinnedPool, options: LoadOptions) -> Outcome<()> {
    let slots = (0..options.most_slots())
        .map(|_| pool.alloc::<u8>(options.slot_bytes))
        .collect::<cuda_pinned::Result<Vec<_>>>()?;
    drop(slots);
    Ok(())
}

/// `bytes` as `64 MiB` where a whole number of MiB (or under one), else as `8.00 GiB` or `52.3 MiB`.
fn human(bytes: u64) -> String {
    if bytes < 1 << 20 || bytes.is_multiple_of(1 << 20) {
        size_label(bytes as usize)
    } else if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    }
}
