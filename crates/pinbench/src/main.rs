//! pinbench: what this machine's host<->GPU link delivers, and what each way of using it costs.
//!
//! On device 0 it measures, and reports as a table (`--json`: one JSON document; `--plot FILE.svg`: a chart):
//! - the machine: device, compute capability, NVIDIA driver release and CUDA version, PCIe link under load;
//! - bandwidth of uploads and downloads from 4 KiB to 1 GiB for pageable memory (through the driver), pageable
//!   memory staged by the crate through a [`PinnedPool`] (`Stream::upload_staged`,
//!   as a ratio to the driver's pageable path), [`Pinned`](cuda_pinned::Pinned) memory (default and
//!   write-combined) and [`Registered`](cuda_pinned::Registered) memory, each pinned figure also timed through
//!   the raw driver call on the same memory, so the safe layer's cost reads as a ratio (`bandwidth.rs`);
//! - with `--staging-sweep`, staged transfers of 256 MiB for a grid of chunk sizes and thread counts
//!   (`sweep.rs`);
//! - an upload and a download at the same time on two streams (`bandwidth.rs`);
//! - the host time of pinning memory (`Pinned`, `Registered`, and the pool's warm and cold allocations) and of
//!   enqueueing a small copy (`costs.rs`);
//! - with feature `gpu`, how well a two-stream pipeline overlaps uploads with a kernel (`overlap.rs`).
//!
//! `pinbench train-loop` (feature `gpu`) instead times a training-loop-shaped program fed five ways
//! (`train_loop.rs`); `pinbench gather` gathers rows by random index into device memory (`gather.rs`);
//! `pinbench devices` measures every device of the machine, alone, all at once, copying between each other, and
//! fed by the sharded prefetcher of rows gathered on each device (`devices/`); `pinbench futures` times how soon
//! an awaiting task learns that device work is done (`futures.rs`); `pinbench requests` serves a server's requests
//! as awaiting tasks and on blocking threads (`requests.rs`); `pinbench graphs` replays a step as a CUDA graph
//! through the crate, against the raw driver's graph and eager launches (`graphs.rs`); `pinbench load` loads a
//! safetensors file into device memory, cold and warm, through the crate's loader, against the disk's ceiling
//! and the driver's pageable path (`load.rs`).
//!
//! Device times come from CUDA events after warm-up, repeated until stable, as medians (`timing.rs`). Every copy's
//! data is checked once; a figure is never a failure, however low, but data that did not arrive intact is.
//! Where no CUDA driver can be loaded, pinbench exits with status 1, the loader's message and how to run it on
//! the simulated driver instead (cuda-pinned-sim, through `CUDA_PINNED_LIBCUDA`), where every report is printed
//! under a banner saying its figures are a simulation's; on a command line it does not understand, with status 2
//! (`cli.rs`).

mod bandwidth;
mod cli;
mod costs;
mod devices;
mod futures;
mod gather;
mod graphs;
mod json;
#[cfg(target_os = "linux")]
mod load;
mod nvml;
#[cfg(feature = "gpu")]
mod overlap;
mod plot;
mod progress;
mod report;
mod requests;
mod results;
mod sweep;
#[cfg(test)]
mod testdata;
mod timing;
#[cfg(feature = "gpu")]
mod train_loop;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use cuda_pinned::{Context, Device, PinnedPool, Pinning, Stream, WhenFull, sys};

use crate::cli::{Cli, Mode, Options};
use crate::progress::Progress;
use crate::results::{DeviceInfo, Header, Report};
use crate::timing::Plan;

/// pinbench's own failures (data that did not arrive intact, a file that cannot be written) beside the crate's.
pub type Outcome<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What every measurement needs: the device's context, a stream, the staging pool, the plan, the progress bar,
/// and fresh seeds for the data pattern.
pub struct Bench {
    /// Device 0's primary context.
    pub context: Context,
    /// The stream single-stream figures run on.
    pub stream: Stream,
    /// The pool staged transfers take their buffers from ([`bandwidth::STAGING_POOL_BYTES`], `Pinning::Auto`),
    /// made once and warmed before the first staged figure. A transfer waits for buffers still in flight rather
    /// than fail when it is full.
    pub pool: PinnedPool,
    /// How much to measure.
    pub plan: Plan,
    /// The bar on stderr.
    pub progress: Progress,
    /// Whether the driver is the simulated one (see [`simulated`]).
    pub simulated: bool,
    seed: u64,
}

impl Bench {
    /// A seed no figure has used yet, so that data left over from an earlier copy never passes a check.
    pub fn next_seed(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0x2545_F491_4F6C_DD1D);
        self.seed
    }
}

fn main() -> ExitCode {
    // On a command line it does not understand, this prints why and exits with status 2.
    let cli = Cli::parse();
    let outcome = match &cli.mode {
        None => run(&cli.options),
        Some(Mode::TrainLoop(options)) => train_loop(options),
        Some(Mode::Gather(options)) => gather_mode(options),
        Some(Mode::Devices(options)) => devices_mode(options),
        Some(Mode::Futures(options)) => futures_mode(options),
        Some(Mode::Requests(options)) => requests_mode(options),
        Some(Mode::Graphs(options)) => graphs_mode(options),
        Some(Mode::Load(options)) => load_mode(options),
    };
    match outcome {
        Ok(failures) if failures.is_empty() => ExitCode::SUCCESS,
        Ok(failures) => {
            eprintln!(
                "pinbench: failed (each is shown in the report): {}",
                failures.join("; ")
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("pinbench: {e}");
            if is_load_error(e.as_ref()) {
                eprintln!("{NO_GPU_HINT}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Said where no driver can be loaded: how to see everything run without a GPU.
const NO_GPU_HINT: &str = "No GPU here? Run pinbench on the simulated driver (cuda-pinned-sim), from the \
                           repository: cargo build --release -p cuda-pinned-sim && \
                           CUDA_PINNED_LIBCUDA=target/release/libcuda_pinned_sim.so cargo run --release --bin \
                           pinbench -- --quick";

/// Printed above every report on the simulated driver.
const SIMULATED_BANNER: &str = "SIMULATED DRIVER (cuda-pinned-sim): the figures below are a simulation's, not a \
                                GPU's.\nThey show that each measurement runs and checks its data, not how fast \
                                anything is.\n\n";

/// Whether `e` is the loader's: no CUDA driver could be loaded.
fn is_load_error(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(e.downcast_ref(), Some(sys::Error::Load { .. }))
        || matches!(e.downcast_ref(), Some(cuda_pinned::Error::Load { .. }))
}

/// Whether the loaded driver is cuda-pinned's simulated one, which exports `cuda_sim_version` beside the
/// driver's functions.
fn simulated() -> Outcome<bool> {
    let driver = sys::driver()?;
    // SAFETY: the library is loaded already (it is the driver), so loading it again runs no initialiser and
    // gives the same library; only whether it has a symbol is asked, and the symbol is never called.
    let lib = unsafe { libloading::Library::new(driver.path()) }?;
    // SAFETY: as above: the symbol's address is looked up, not used.
    Ok(unsafe { lib.get::<*const ()>(b"cuda_sim_version\0") }.is_ok())
}

/// `text`, under [`SIMULATED_BANNER`] on the simulated driver.
fn with_banner(simulated: bool, text: String) -> String {
    if simulated {
        format!("{SIMULATED_BANNER}{text}")
    } else {
        text
    }
}

/// `pinbench train-loop`: measures and reports; nothing to check afterwards, so no failures.
#[cfg(feature = "gpu")]
fn train_loop(options: &cli::TrainLoopOptions) -> Outcome<Vec<String>> {
    let figures = train_loop::measure(&train_loop::Settings::new(options))?;
    if options.json {
        print(&json::pretty(&figures)?);
    } else {
        print(&train_loop::table(&figures));
    }
    Ok(Vec::new())
}

/// Without the crate's kernels there is no compute step to feed.
#[cfg(not(feature = "gpu"))]
fn train_loop(_: &cli::TrainLoopOptions) -> Outcome<Vec<String>> {
    Err("train-loop runs the crate's kernels: build pinbench with --features gpu".into())
}

/// `pinbench gather`: the failures are batches whose rows arrived wrong.
fn gather_mode(options: &cli::GatherOptions) -> Outcome<Vec<String>> {
    let simulated = simulated()?;
    let figures = gather::measure(&gather::Settings::new(options.quick, simulated))?;
    if options.json {
        print(&json::pretty(&figures)?);
    } else {
        print(&with_banner(simulated, gather::table(&figures)));
    }
    Ok(figures
        .rows
        .iter()
        .filter(|r| !r.verified)
        .map(|r| format!("data check of the gather of rows of {} bytes", r.row_bytes))
        .collect())
}

/// `pinbench futures`: figures only, nothing to check afterwards.
fn futures_mode(options: &cli::FuturesOptions) -> Outcome<Vec<String>> {
    let simulated = simulated()?;
    let figures = futures::measure(options.quick)?;
    if options.json {
        print(&json::pretty(&figures)?);
    } else {
        print(&with_banner(simulated, futures::table(&figures)));
    }
    Ok(Vec::new())
}

/// `pinbench requests`: a failure is a request that read a wrong result.
fn requests_mode(options: &cli::FuturesOptions) -> Outcome<Vec<String>> {
    let simulated = simulated()?;
    let figures = requests::measure(options.quick)?;
    if options.json {
        print(&json::pretty(&figures)?);
    } else {
        print(&with_banner(simulated, requests::table(&figures)));
    }
    Ok(if figures.verified {
        Vec::new()
    } else {
        vec!["a request read a wrong result".into()]
    })
}

/// `pinbench graphs`: a failure is a way of running the step whose results differ from the others'.
fn graphs_mode(options: &cli::FuturesOptions) -> Outcome<Vec<String>> {
    let simulated = simulated()?;
    let figures = graphs::measure(options.quick)?;
    if options.json {
        print(&json::pretty(&figures)?);
    } else {
        print(&with_banner(simulated, graphs::table(&figures)));
    }
    Ok(if figures.verified {
        Vec::new()
    } else {
        vec!["the step's results differ between the eager, raw-graph and crate-graph runs".into()]
    })
}

/// `pinbench load`: the failures are loads whose data arrived wrong.
#[cfg(target_os = "linux")]
fn load_mode(options: &cli::LoadOptions) -> Outcome<Vec<String>> {
    let simulated = simulated()?;
    let figures = load::measure(&load::Settings::new(options, simulated))?;
    if options.json {
        print(&json::pretty(&load::document(&figures, simulated))?);
    } else {
        print(&with_banner(simulated, load::table(&figures)));
    }
    Ok(figures
        .failures()
        .into_iter()
        .map(|f| format!("data check of {f}"))
        .collect())
}

/// Direct reads, the page cache's advice and residency are asked of Linux.
#[cfg(not(target_os = "linux"))]
fn load_mode(_: &cli::LoadOptions) -> Outcome<Vec<String>> {
    Err("pinbench load runs on Linux only (O_DIRECT, posix_fadvise, mincore)".into())
}

/// `pinbench devices`: the failures are figures whose data arrived wrong; a copy between devices that failed
/// is an error, returned once the report (which shows it in its cell) is printed.
fn devices_mode(options: &cli::DevicesOptions) -> Outcome<Vec<String>> {
    let simulated = simulated()?;
    let figures = devices::measure(&devices::Settings::new(options.quick))?;
    if options.json {
        print(&json::pretty(&devices::document(&figures))?);
    } else {
        print(&with_banner(simulated, devices::table(&figures)));
    }
    let (errors, failures) = (figures.errors(), figures.failures());
    let Some(first) = errors.first() else {
        return Ok(failures
            .into_iter()
            .map(|f| format!("data check of {f}"))
            .collect());
    };
    // The report lists every failed copy; the message names the first, and how many there were.
    let mut message = format!(
        "{} of {} copies between devices failed (each is shown in the report); the first: {first}",
        errors.len(),
        figures.peer.len(),
    );
    if !failures.is_empty() {
        message.push_str(&format!(
            "; and the data that arrived differs from the source for: {}",
            failures.join("; ")
        ));
    }
    Err(message.into())
}

/// Writes to stdout; a closed stdout (`pinbench | head`) ends the output, not the program.
fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Measures, reports, and returns what failed: the data checks, and the sections that could not be measured.
fn run(options: &Options) -> Outcome<Vec<String>> {
    let started = Instant::now();
    let driver = sys::driver()?;
    let simulated = simulated()?;
    let nvml = nvml::Nvml::open();
    let devices = Device::all()?;
    let Some(&device) = devices.first() else {
        return Err("the driver sees no CUDA device: nothing to measure".into());
    };
    let info = DeviceInfo {
        ordinal: device.ordinal(),
        name: device.name()?,
        compute_capability: device.compute_capability()?,
        memory_bytes: device.total_memory()?,
        pci_bus_id: device.pci_bus_id()?,
        copy_engines: device.async_engine_count()?,
    };
    let plan = if options.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    let context = Context::new(device)?;
    let total = estimate(&plan, options);
    let mut bench = Bench {
        stream: Stream::new(&context)?,
        pool: PinnedPool::builder(&context, bandwidth::STAGING_POOL_BYTES)
            .pinning(Pinning::Auto)
            .when_full(WhenFull::Wait)
            .build(),
        context,
        progress: Progress::new(options.progress, total),
        plan,
        simulated,
        seed: 0x5EED,
    };

    // Each section that stops at an error is reported as not measured, and the others still run.
    let mut not_measured = Vec::new();
    let bandwidth = section(
        &mut not_measured,
        "bandwidth",
        bandwidth::bandwidth(&mut bench),
    )
    .unwrap_or_default();
    section(
        &mut not_measured,
        "bandwidth",
        bench.context.synchronize().map_err(Into::into),
    );
    let staged_turns = section(
        &mut not_measured,
        "staged against pageable in turns",
        bandwidth::staged_turns(&mut bench),
    )
    .unwrap_or_default();
    let staging_sweep = if options.staging_sweep {
        section(&mut not_measured, "staging sweep", sweep::sweep(&mut bench))
    } else {
        None
    };
    let mut link = None;
    let bidirectional = section(
        &mut not_measured,
        "both directions at once",
        bandwidth::bidirectional(&mut bench, &mut || {
            link = nvml.as_ref().and_then(|n| n.pcie_link(&info.pci_bus_id));
        }),
    )
    .unwrap_or_default();
    let enqueue = section(
        &mut not_measured,
        "enqueue overhead",
        costs::enqueue(&mut bench),
    );
    let allocation = section(
        &mut not_measured,
        "allocation",
        costs::allocation(&mut bench),
    )
    .unwrap_or_default();
    #[cfg(feature = "gpu")]
    let overlap = section(&mut not_measured, "overlap", overlap::overlap(&mut bench));
    #[cfg(not(feature = "gpu"))]
    let overlap = None;
    section(
        &mut not_measured,
        "the end of the run",
        bench.context.synchronize().map_err(Into::into),
    );
    section(
        &mut not_measured,
        "the end of the run",
        bench.context.check_deferred_errors().map_err(Into::into),
    );
    bench.progress.finish();

    let report = Report {
        quick: options.quick,
        header: Header {
            device: info,
            device_count: devices.len(),
            nvidia_driver: nvml.as_ref().and_then(nvml::Nvml::driver_release),
            cuda_version: driver.version(),
            driver_library: driver.path().to_string(),
            pcie: link,
            simulated,
        },
        bandwidth,
        staged_turns,
        staging_sweep,
        bidirectional,
        allocation,
        enqueue,
        overlap,
        not_measured,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    let plot = options.plot.as_ref().map(|p| p.display().to_string());
    if let Some(path) = &options.plot {
        std::fs::write(path, plot::render(&report)?)
            .map_err(|e| format!("writing the plot to {}: {e}", path.display()))?;
    }
    if options.json {
        print(&json::pretty(&json::document(&report, plot.as_deref()))?);
    } else {
        let mut text = with_banner(simulated, report::table(&report));
        if let Some(plot) = &plot {
            text.push_str(&format!("\nplot written to {plot}\n"));
        }
        print(&text);
    }
    Ok(report
        .failures()
        .into_iter()
        .map(|f| format!("data check of {f}"))
        .chain(
            report
                .not_measured
                .iter()
                .map(|n| format!("not measured: {n}")),
        )
        .collect())
}

/// `result`'s value; or, where it is an error, `None`, with the section `name` and the error added to
/// `not_measured`.
fn section<T>(not_measured: &mut Vec<String>, name: &str, result: Outcome<T>) -> Option<T> {
    result
        .map_err(|e| not_measured.push(format!("{name}: {e}")))
        .ok()
}

/// The estimated seconds of the whole plan and options, for the progress bar.
fn estimate(plan: &Plan, options: &Options) -> f64 {
    let overlap = {
        #[cfg(feature = "gpu")]
        {
            overlap::estimate(plan)
        }
        #[cfg(not(feature = "gpu"))]
        {
            0.0
        }
    };
    let sweep = if options.staging_sweep {
        sweep::estimate(plan)
    } else {
        0.0
    };
    bandwidth::estimate_all(plan)
        + bandwidth::estimate_turns(plan)
        + sweep
        + bandwidth::estimate_bidirectional(plan)
        + costs::estimate_enqueue(plan)
        + costs::estimate_allocation(plan)
        + overlap
}
