//! pinbench's command line: a handful of flags, parsed by hand so that the library's build carries no CLI
//! dependency.

use std::fmt;
use std::path::PathBuf;

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// `--quick`: fewer sizes and repetitions, no 1 GiB, for a run under 20 seconds.
    pub quick: bool,
    /// `--json`: one JSON document on stdout instead of the table.
    pub json: bool,
    /// `--plot FILE.svg`: also write an SVG chart of bandwidth against size.
    pub plot: Option<PathBuf>,
    /// `--progress`: draw the progress bar on stderr even when it is not a terminal.
    pub progress: bool,
    /// `--staging-sweep`: also measure staged transfers of 256 MiB for every chunk size and thread count of a
    /// small grid, to tune `StagingOptions::default()`.
    pub staging_sweep: bool,
    /// `--help`: print the usage and exit.
    pub help: bool,
}

/// A command line pinbench does not understand: it exits with status 2 and says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The text `--help` prints.
pub const USAGE: &str = "\
pinbench: what this machine's host<->GPU link delivers, and what each way of using it costs

Usage: pinbench [--quick] [--json] [--plot FILE.svg] [--progress] [--staging-sweep]

Measures device 0: bandwidth of uploads and downloads from 4 KiB to 1 GiB from pageable memory (through the
driver), pageable memory staged by the crate through a pinned pool (Stream::upload_staged / download_staged,
default options, also as a ratio to the driver's pageable path), pinned memory (default and write-combined)
and registered memory, each pinned figure also as a ratio to the raw driver call on the same memory; both
directions at once; the cost of pinning memory (Pinned::zeroed, Registered::new, and PinnedPool::alloc warm
and cold, the cold ones as a ratio to Pinned::zeroed); the host time to enqueue a small copy; and (built with
--features gpu) how well copies overlap a kernel.
Times are medians of CUDA-event-timed repetitions after warm-up. Every copy's data is verified once.

Options:
  --quick           sizes up to 64 MiB, fewer repetitions, no 1 GiB: a run of under 20 seconds
  --json            print one JSON document on stdout (every figure, its units and the header)
  --plot FILE.svg   write an SVG chart of bandwidth (GB/s) against size per method and direction
  --progress        draw the progress bar on stderr even when stderr is not a terminal
  --staging-sweep   also time staged uploads and downloads of 256 MiB for chunks of 2, 4, 8, 16 and 32 MiB
                    x 1, 2, 4 and 8 threads, beside the driver's pageable path (adds 20 to 30 seconds)
  -h, --help        print this help

Exit status: 0 when the run completed (low figures are reported, never failures), 1 on a CUDA error, a
missing driver or data that did not arrive intact, 2 on a command line pinbench does not understand.
Environment: CUDA_PINNED_LIBCUDA names the driver library to open instead of searching for libcuda.so.1.
";

/// Parses the arguments after the program's name.
///
/// # Errors
/// A [`UsageError`] for an unknown flag, a positional argument, or `--plot` without a file.
pub fn parse<I, S>(args: I) -> Result<Options, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut options = Options::default();
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--json" => options.json = true,
            "--progress" => options.progress = true,
            "--staging-sweep" => options.staging_sweep = true,
            "-h" | "--help" => options.help = true,
            "--plot" => {
                let file = args
                    .next()
                    .filter(|f| !f.is_empty() && !f.starts_with("--"))
                    .ok_or_else(|| {
                        UsageError("--plot needs a file name: --plot FILE.svg".into())
                    })?;
                options.plot = Some(PathBuf::from(file));
            }
            other => {
                if let Some(file) = other.strip_prefix("--plot=") {
                    if file.is_empty() {
                        return Err(UsageError(
                            "--plot needs a file name: --plot FILE.svg".into(),
                        ));
                    }
                    options.plot = Some(PathBuf::from(file));
                } else if other.starts_with('-') {
                    return Err(UsageError(format!("unknown flag `{other}`")));
                } else {
                    return Err(UsageError(format!(
                        "unexpected argument `{other}`: pinbench takes only flags"
                    )));
                }
            }
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Result<Options, UsageError> {
        parse(args.iter().copied())
    }

    #[test]
    fn no_flags_is_the_full_table_run() {
        assert_eq!(parsed(&[]).unwrap(), Options::default());
    }

    #[test]
    fn every_flag_is_understood() {
        let o = parsed(&[
            "--quick",
            "--json",
            "--plot",
            "out.svg",
            "--progress",
            "--staging-sweep",
        ])
        .unwrap();
        assert!(o.quick && o.json && o.progress && o.staging_sweep && !o.help);
        assert!(!parsed(&["--quick"]).unwrap().staging_sweep);
        assert_eq!(o.plot, Some(PathBuf::from("out.svg")));
        assert!(parsed(&["-h"]).unwrap().help);
        assert!(parsed(&["--help"]).unwrap().help);
        let o = parsed(&["--plot=a b.svg"]).unwrap();
        assert_eq!(o.plot, Some(PathBuf::from("a b.svg")));
    }

    #[test]
    fn unknown_flags_and_arguments_are_usage_errors() {
        let e = parsed(&["--quik"]).unwrap_err();
        assert_eq!(e.0, "unknown flag `--quik`");
        assert!(parsed(&["-q"]).is_err());
        assert!(
            parsed(&["quick"])
                .unwrap_err()
                .0
                .contains("unexpected argument")
        );
    }

    #[test]
    fn plot_needs_a_file() {
        for args in [&["--plot"][..], &["--plot", "--json"], &["--plot="]] {
            let e = parsed(args).unwrap_err();
            assert!(e.0.starts_with("--plot needs a file name"), "{args:?}: {e}");
        }
    }

    #[test]
    fn usage_names_every_flag() {
        for flag in [
            "--quick",
            "--json",
            "--plot",
            "--progress",
            "--staging-sweep",
            "--help",
        ] {
            assert!(USAGE.contains(flag), "{flag}");
        }
    }
}
