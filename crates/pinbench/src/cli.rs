//! pinbench's command line: the bandwidth run's flags, and the other modes (`train-loop`, `gather`, `devices`,
//! `futures`, `requests`, `graphs`, `load`) with their own.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// pinbench: what this machine's host<->GPU link delivers, and what each way of using it costs
///
/// Measures device 0: bandwidth of uploads and downloads from 4 KiB to 1 GiB from pageable memory (through the
/// driver), pageable memory staged by the crate through a pinned pool (Stream::upload_staged /
/// download_staged, default options, also as a ratio to the driver's pageable path), pinned memory (default and
/// write-combined) and registered memory, each pinned figure also as a ratio to the raw driver call on the same
/// memory; both directions at once; the cost of pinning memory (Pinned::zeroed, Registered::new, and
/// PinnedPool::alloc warm and cold, the cold ones as a ratio to Pinned::zeroed); the host time to enqueue a
/// small copy; and (built with --features gpu) how well copies overlap a kernel. Times are medians of
/// CUDA-event-timed repetitions after warm-up. Every copy's data is verified once.
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
#[command(
    name = "pinbench",
    version,
    after_help = AFTER_HELP,
    disable_help_subcommand = true,
    // The bandwidth run's flags mean nothing to another mode, which has flags of its own.
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Another measurement instead of the bandwidth run.
    #[command(subcommand)]
    pub mode: Option<Mode>,
    /// The bandwidth run's flags.
    #[command(flatten)]
    pub options: Options,
}

/// The bandwidth run's flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct Options {
    /// Sizes up to 64 MiB, fewer repetitions, no 1 GiB: a run of under 20 seconds
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout (every figure, its units and the header) instead of the table
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG chart of bandwidth (GB/s) against size per method and direction
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Draw the progress bar on stderr even when stderr is not a terminal
    #[arg(long)]
    pub progress: bool,
    /// Also time staged uploads and downloads of 256 MiB for chunks of 2, 4, 8, 16 and 32 MiB x 1, 2, 4, 8 and
    /// 16 threads, beside the driver's pageable path (adds 20 to 30 seconds)
    #[arg(long)]
    pub staging_sweep: bool,
}

/// The modes other than the bandwidth run.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Mode {
    /// How fast a training loop is fed, five ways (needs a build with --features gpu)
    ///
    /// Batches of 32 MiB of samples (2048 samples of 16 KiB, or 32 MiB / N samples of N bytes with
    /// --sample-bytes N), gathered by random index from a dataset in pageable memory, feed a compute step on
    /// device 0 (an axpy that reads the batch, then a kernel as long as one batch's upload), three ways: (1)
    /// gathered into a Vec and uploaded with a blocking copy; (2) gathered into pinned memory on the worker
    /// threads and uploaded asynchronously, one step at a time; (3) through a Prefetcher, whose workers gather
    /// into pooled pinned memory ahead of the loop while a copy stream uploads. Each way is reported in
    /// samples/s and GB/s fed, with its streams' device time per kind of work; the prefetcher is compared with
    /// the pinned upload, the gather on the same threads and the compute alone, all measured in the same run.
    /// Then the prefetcher runs again with a compute step as long as the slower of gathering and uploading a
    /// batch. Last, a fifth way: the prefetcher gathering on the device (GatherBatch), the dataset copied once
    /// into mapped pinned memory and one worker writing each batch's indices, against the compute alone.
    TrainLoop(TrainLoopOptions),
    /// How fast rows are gathered by random index from a page-locked table into device memory
    ///
    /// Batches of 64 MiB of rows (64 B to 256 KiB) at random indices of a 4 GiB table of mapped pinned memory,
    /// by the crate's gather kernel (the device reads the rows over the bus; in the batch's order, and with the
    /// indices sorted on the device first), by the copy engines (one batched call per gather), and by the CPU
    /// gathering into pinned memory on all cores before one upload; each as GB/s of rows and as a ratio to a
    /// contiguous pinned upload of 64 MiB in the same run. Then some of the kernel's figures from a Vec
    /// registered in place, whose base is not page-aligned.
    Gather(GatherOptions),
    /// Every device of the machine: each alone, all at once, and copies between them
    ///
    /// For hosts of several GPUs. Per device: uploads and downloads of 256 MiB (64 MiB with --quick) between its
    /// own pinned memory and its memory, on a stream of its context, timed by CUDA events (medians after
    /// warm-up). Then every device uploading its own pinned buffer at the same time (as nvbandwidth's
    /// host_to_all), one host thread per device started together, and every device uploading one shared pinned
    /// buffer at the same time: aggregate GB/s over the host's wall time from the common start to the last
    /// device's end (medians of rounds), and the ratio to device 0 alone timed the same way. Last, the copy
    /// matrix: for every ordered pair of devices, a copy from the source's memory into the destination's
    /// (Stream::copy on a stream of the destination; the diagonal copies within a device, its bytes counted
    /// once). Peer access is enabled both ways before a pair's copies, untimed; each cell says whether its
    /// copies went direct (peer access) or staged through pinned memory (the devices cannot access each
    /// other's memory). Then the prefetched gathers: Prefetcher::sharded of GatherBatch, one feed per device,
    /// each device's gather kernel reading random 16 KiB rows, 32 MiB per batch, from one table of mapped
    /// pinned memory that all devices share (4 GiB; 1 GiB with --quick), 128 batches per device (16 with
    /// --quick): GB/s fed to device 0 alone and to every device at once, host wall time from a common start to
    /// the last device's end (medians of rounds), and their ratio; one batch per device is verified. The
    /// header gives each device's name, PCI bus id, NUMA node (as sysfs gives it, and the node the library
    /// places its pinned memory on), PCIe link, and the driver's release. Every copy's data is verified once. A
    /// copy of the matrix that fails (enabling peer access included) is shown as an error in its cell, and the
    /// run then exits with status 1 once the report is printed; gather kernels that cannot be loaded (a driver
    /// older than their PTX) leave the prefetched gathers unmeasured, saying why. With one device: its figures,
    /// "all at once" is that device alone, and a matrix of one.
    Devices(DevicesOptions),
    /// How soon a task awaiting device work learns it is done, and what the futures' reactor costs
    ///
    /// Trials of 50 us of device work on device 0 followed by the stream's future (Stream::done), awaited by
    /// a thread that sleeps until woken, against a thread spinning on cuStreamQuery for the same work: the
    /// extra latency (median, p90, p99) with one future pending, with 10,000 more pending (1,000 stream points
    /// on 10 busy streams, the rest futures of 100 events recorded among them), and with the future spinning
    /// first (Done::spin_for). Then 100,000 futures registered the same way (how many were pending at once, how
    /// long after their work the last completed), the process's CPU time over a second with nothing pending,
    /// and how many stream points one stream, and eight, take behind a running kernel before an enqueue waits.
    /// 2000 trials (300 with --quick).
    Futures(FuturesOptions),
    /// A server's requests served as tasks that await the device, against blocking threads
    ///
    /// 1000 requests in flight at once on device 0, each writing 64 KiB of input, uploading it, running a
    /// kernel (a fill and an axpy with --features gpu, else a device copy), downloading the result and reading
    /// it, 50 rounds each (10 with --quick): as tasks on tokio (4, 8, 16 and one per core worker threads)
    /// awaiting the input's and the result's buffers (Pinned::writable / readable), and on 1000 threads whose
    /// accessors wait in the driver (as_mut_slice / as_slice). Requests per second each way (the better of two
    /// runs, alternating) and the ratios; every result is checked.
    Requests(FuturesOptions),
    /// A step replayed as a CUDA graph through the crate, against the raw driver's graph and eager launches
    ///
    /// A step of 1000 small launches over 64 buffers on 2 streams of device 0 (the crate's axpy kernel with
    /// --features gpu, else device copies), every 16th reading a buffer the other stream writes: captured
    /// and instantiated through the crate (Graph::capture) and with raw driver calls (events at the
    /// crossings), replayed 100 times back to back, and issued eagerly through the crate. Medians of 7 rounds
    /// (3 with --quick): capture plus instantiation, the wall time of a step, the host time of one launch call
    /// (in a loop of launches, and right after a synchronization), and the ratios; every way's results are
    /// checked against the others'.
    Graphs(FuturesOptions),
    /// A safetensors checkpoint from a file into device memory, cold and warm, against the disk's ceiling
    ///
    /// Writes a safetensors file of 8 GiB of fresh bytes (1 GiB with --quick, 64 MiB on the simulated driver;
    /// --gib N otherwise), bf16 tensors of 256 MiB (16 of a 16th for smaller files), at --path or in the
    /// temporary directory, reused where an earlier run kept it (--keep), else removed at the end; the report
    /// names the file system and the disk under it (/proc/mounts, sysfs). Then, cold (fsync and posix_fadvise(DONTNEED) of the file)
    /// and warm (the file read once just before), each figure one run on device 0, GB/s of the wall time until
    /// the data is on the device: the ceiling, reads alone (O_DIRECT cold, buffered warm) on as many threads as
    /// the loader reads with, each into a page-aligned buffer of its slot size; Stream::load_file of the whole
    /// file into one device buffer, default options (how it read and why, its readers, slots and pinned
    /// memory); SafeTensorsFile::open + load; std::fs::read into a Vec, then upload_pageable; mmap of the file,
    /// then upload_pageable. The fraction of the file in the page cache before each figure is asked (mincore)
    /// and shown: a figure not cold or warm as asked (tmpfs keeps its pages) is marked, never passed off as
    /// such. References: a warm Vec of 1 GiB copied into pinned memory on every core, and a pinned upload of
    /// 1 GiB (16 MiB each on the simulated driver). Each figure as a ratio to the ceiling of the same state and to the pinned upload, and the goals:
    /// cold load_file / ceiling >= 0.90, warm load_file / min(host copy into pinned, pinned upload) >= 0.85.
    /// Every load's device memory is checked against the file (64 evenly spaced 1 MiB pieces and the first and
    /// last MiB). Linux only.
    Load(LoadOptions),
}

/// `load`'s flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct LoadOptions {
    /// A file of 1 GiB instead of 8
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
    /// GiB of tensors in the file, fractions too (0.05) [default: 8, or 1 with --quick, 64 MiB on the simulated
    /// driver]
    #[arg(long = "gib", value_name = "N", value_parser = gib)]
    pub data_bytes: Option<usize>,
    /// The file to write and load, or a directory to write it in [default: the temporary directory]; a file
    /// there that pinbench load did not write is never overwritten
    #[arg(long, value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Keep the file at the end, for a later run of the same size to reuse
    #[arg(long)]
    pub keep: bool,
    /// Also load cold with 1, 2, 4 and 8 readers x slots of 4, 16 and 64 MiB, to choose the defaults
    #[arg(long)]
    pub sweep: bool,
}

/// `--gib`: a finite number of GiB, of at least one row of a tensor (8 KiB), as bytes.
fn gib(arg: &str) -> Result<usize, String> {
    let n: f64 = arg
        .parse()
        .map_err(|e| format!("{arg:?} is not a number of GiB: {e}"))?;
    let bytes = n * f64::from(1u32 << 30);
    if !bytes.is_finite() || bytes < 8192.0 || bytes >= usize::MAX as f64 {
        Err(format!("{arg} GiB is not a size of at least 8 KiB"))
    } else {
        Ok(bytes as usize)
    }
}

/// `futures`', `requests`' and `graphs`' flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct FuturesOptions {
    /// 300 trials instead of 2000
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
}

/// `devices`' flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct DevicesOptions {
    /// Copies of 64 MiB and fewer repetitions, instead of 256 MiB
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
}

/// `gather`'s flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct GatherOptions {
    /// A table of 1 GiB and 3 repetitions, instead of 4 GiB and 7
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
}

/// `train-loop`'s flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct TrainLoopOptions {
    /// A dataset of 512 MiB and 40 batches, instead of 2 GiB and 400
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
    /// Threads gathering batches [default: the CPU's cores, at most 16]
    #[arg(long, value_name = "N")]
    pub workers: Option<NonZeroUsize>,
    /// Batches of 32 MiB to feed [default: 400, or 40 with --quick]
    #[arg(long, value_name = "N")]
    pub batches: Option<NonZeroUsize>,
    /// Gather with ordinary stores instead of streaming (non-temporal) ones on x86-64
    #[arg(long)]
    pub plain_stores: bool,
    /// Bytes per sample: a multiple of 4 (whole f32 values) that divides 32 MiB, so a power of two from 4 to
    /// 33554432; a batch stays 32 MiB, of 32 MiB / N samples [default: 16384]
    #[arg(long, value_name = "N", value_parser = sample_bytes)]
    pub sample_bytes: Option<usize>,
}

/// Bytes of samples in a `train-loop` batch, whatever the size of a sample (32 MiB).
pub const BATCH_BYTES: usize = 32 << 20;

/// `--sample-bytes`: a positive number of whole f32 values whose size divides [`BATCH_BYTES`], so that a batch
/// is a whole number of samples. Anything else is a usage error.
fn sample_bytes(arg: &str) -> Result<usize, String> {
    let n: usize = arg
        .parse()
        .map_err(|e| format!("{arg:?} is not a number of bytes: {e}"))?;
    if n == 0 || !n.is_multiple_of(4) {
        Err(format!(
            "{n} is not a positive multiple of 4 (a sample is whole f32 values)"
        ))
    } else if n > BATCH_BYTES {
        Err(format!(
            "a sample of {n} bytes exceeds a batch ({BATCH_BYTES} bytes)"
        ))
    } else if !BATCH_BYTES.is_multiple_of(n) {
        Err(format!(
            "{n} does not divide a batch's {BATCH_BYTES} bytes (samples of a power of two bytes do)"
        ))
    } else {
        Ok(n)
    }
}

/// What `--help` prints after the flags.
const AFTER_HELP: &str = "\
Exit status: 0 when the run completed (low figures are reported, never failures), 1 on a CUDA error, a \
missing driver or data that did not arrive intact, 2 on a command line pinbench does not understand.
Environment: CUDA_PINNED_LIBCUDA names the driver library to open instead of searching for libcuda.so.1.";

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parsed(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pinbench").chain(args.iter().copied()))
    }

    fn options(args: &[&str]) -> Options {
        let cli = parsed(args).unwrap();
        assert_eq!(cli.mode, None);
        cli.options
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_flags_is_the_full_table_run() {
        assert_eq!(options(&[]), Options::default());
    }

    #[test]
    fn every_flag_is_understood() {
        let o = options(&[
            "--quick",
            "--json",
            "--plot",
            "out.svg",
            "--progress",
            "--staging-sweep",
        ]);
        assert!(o.quick && o.json && o.progress && o.staging_sweep);
        assert_eq!(o.plot, Some(PathBuf::from("out.svg")));
        assert!(!options(&["--quick"]).staging_sweep);
        assert_eq!(
            options(&["--plot=a b.svg"]).plot,
            Some(PathBuf::from("a b.svg"))
        );
        for help in ["-h", "--help"] {
            assert_eq!(parsed(&[help]).unwrap_err().kind(), ErrorKind::DisplayHelp);
        }
    }

    #[test]
    fn unknown_flags_and_arguments_are_usage_errors() {
        for args in [&["--quik"][..], &["-q"], &["quick"]] {
            let e = parsed(args).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand
                ),
                "{args:?}: {e}"
            );
            // clap exits with status 2 on these, as pinbench always has.
            assert_eq!(e.exit_code(), 2);
        }
    }

    #[test]
    fn plot_needs_a_file() {
        for args in [&["--plot"][..], &["--plot", "--json"], &["--plot="]] {
            let e = parsed(args).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::InvalidValue | ErrorKind::NoEquals),
                "{args:?}: {e}"
            );
        }
    }

    #[test]
    fn train_loop_has_its_own_flags() {
        let cli = parsed(&["train-loop"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::TrainLoop(TrainLoopOptions::default())));
        let cli = parsed(&[
            "train-loop",
            "--quick",
            "--json",
            "--workers",
            "4",
            "--batches",
            "10",
            "--plain-stores",
            "--sample-bytes",
            "4096",
        ])
        .unwrap();
        let Some(Mode::TrainLoop(o)) = cli.mode else {
            panic!("not train-loop")
        };
        assert!(o.quick && o.json && o.plain_stores);
        assert_eq!(o.workers, NonZeroUsize::new(4));
        assert_eq!(o.batches, NonZeroUsize::new(10));
        assert_eq!(o.sample_bytes, Some(4096));
        assert!(parsed(&["train-loop", "--workers", "0"]).is_err());
        // Every power of two from 4 bytes to a whole batch is a sample size.
        for n in (2..=25).map(|shift| 1usize << shift) {
            let Some(Mode::TrainLoop(o)) = parsed(&["train-loop", &format!("--sample-bytes={n}")])
                .unwrap()
                .mode
            else {
                panic!("not train-loop")
            };
            assert_eq!(o.sample_bytes, Some(n));
        }
        // Not a positive multiple of 4, not a divisor of 32 MiB, larger than 32 MiB, or no number at all.
        for n in [
            "0", "2", "6", "-4", "12", "4100", "67108864", "33554436", "1e3", "16k", "",
        ] {
            let e = parsed(&["train-loop", &format!("--sample-bytes={n}")]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{n:?}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
        assert!(parsed(&["train-loop", "--sample-bytes"]).is_err());
        // The bandwidth run's flags are not train-loop's, on either side of it.
        assert!(parsed(&["train-loop", "--plot", "x.svg"]).is_err());
        assert!(parsed(&["--quick", "train-loop"]).is_err());
    }

    #[test]
    fn devices_has_its_own_flags() {
        let cli = parsed(&["devices"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Devices(DevicesOptions::default())));
        assert_eq!(cli.options, Options::default());
        for args in [
            &["devices", "--quick", "--json"][..],
            &["devices", "--json", "--quick"],
        ] {
            let cli = parsed(args).unwrap();
            assert_eq!(
                cli.mode,
                Some(Mode::Devices(DevicesOptions {
                    quick: true,
                    json: true
                })),
                "{args:?}"
            );
        }
        let Some(Mode::Devices(o)) = parsed(&["devices", "--json"]).unwrap().mode else {
            panic!("not devices")
        };
        assert!(o.json && !o.quick);
        // Flags of other modes, and of the bandwidth run on either side of it, are usage errors.
        for args in [
            &["devices", "--plot", "x.svg"][..],
            &["devices", "--staging-sweep"],
            &["devices", "--workers", "2"],
            &["devices", "--progress"],
            &["--quick", "devices"],
            &["devices", "0"],
            &["device"],
        ] {
            let e = parsed(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
        let mut command = Cli::command();
        let devices = command.find_subcommand_mut("devices").unwrap();
        let help = devices.render_long_help().to_string();
        for needle in [
            "--quick",
            "--json",
            "host_to_all",
            "NUMA",
            "Prefetcher::sharded",
        ] {
            assert!(help.contains(needle), "{needle} in\n{help}");
        }
    }

    #[test]
    fn load_has_its_own_flags() {
        let cli = parsed(&["load"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Load(LoadOptions::default())));
        let cli = parsed(&[
            "load", "--quick", "--json", "--gib", "0.05", "--path", "/d/f", "--keep", "--sweep",
        ])
        .unwrap();
        let Some(Mode::Load(o)) = cli.mode else {
            panic!("not load")
        };
        assert!(o.quick && o.json && o.keep && o.sweep);
        assert_eq!(o.data_bytes, Some((0.05 * f64::from(1u32 << 30)) as usize));
        assert_eq!(o.path, Some(PathBuf::from("/d/f")));
        for n in ["0", "-1", "inf", "NaN", "1e-9", "x", ""] {
            let e = parsed(&["load", &format!("--gib={n}")]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{n:?}: {e}");
            assert_eq!(e.exit_code(), 2);
        }
        for args in [
            &["load", "--plot", "x.svg"][..],
            &["--quick", "load"],
            &["load", "--path"],
        ] {
            assert_eq!(parsed(args).unwrap_err().exit_code(), 2, "{args:?}");
        }
        let mut command = Cli::command();
        let help = command
            .find_subcommand_mut("load")
            .unwrap()
            .render_long_help()
            .to_string();
        for needle in [
            "--quick",
            "--json",
            "--gib <N>",
            "--path <PATH>",
            "--keep",
            "--sweep",
            "O_DIRECT",
            "posix_fadvise",
            "mincore",
            "0.90",
            "0.85",
        ] {
            assert!(help.contains(needle), "{needle} in\n{help}");
        }
    }

    #[test]
    fn help_names_every_flag_and_mode() {
        let help = Cli::command().render_long_help().to_string();
        for needle in [
            "--quick",
            "--json",
            "--plot <FILE.svg>",
            "--progress",
            "--staging-sweep",
            "--help",
            "train-loop",
            "gather",
            "devices",
            "load",
            "Exit status",
            "CUDA_PINNED_LIBCUDA",
        ] {
            assert!(help.contains(needle), "{needle} in\n{help}");
        }
        let mut command = Cli::command();
        let train_loop = command.find_subcommand_mut("train-loop").unwrap();
        let help = train_loop.render_long_help().to_string();
        for flag in [
            "--quick",
            "--json",
            "--workers <N>",
            "--batches <N>",
            "--plain-stores",
            "--sample-bytes <N>",
        ] {
            assert!(help.contains(flag), "{flag} in\n{help}");
        }
    }
}
