//! What a load error adds for a program that could run on the simulated driver (cuda-pinned-sim) instead:
//! how to install it in a test binary, or which file to load beside a program built with it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::error::Library;

/// [`simulator_hint`] for the running program: its path, and the files of its folder and of the folder above,
/// each folder's newest first.
pub(crate) fn simulator_hint_here(library: Library) -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let mut listing = Vec::new();
    for dir in exe.ancestors().skip(1).take(2) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .map(|entry| {
                let modified = entry.metadata().and_then(|m| m.modified());
                (modified.unwrap_or(std::time::UNIX_EPOCH), entry.path())
            })
            .collect();
        files.sort_by(|a, b| b.cmp(a));
        listing.extend(files.into_iter().map(|(_, path)| path));
    }
    simulator_hint(library, &exe, &listing)
}

/// What a load error adds for a program that could run on the simulated driver (cuda-pinned-sim) instead: how
/// to install it, where `exe` is a test binary; which file to load, where `listing` (the files of `exe`'s folder
/// and of the folder above, in the order to prefer) has a build of the simulator. `None` for any other program,
/// whose message is the loader's alone.
///
/// A test binary is told by its path alone, as cargo makes it: `<target>/<profile>/deps/<name>-<hash>`. (The
/// environment tells nothing reliable: cargo sets `CARGO_MANIFEST_DIR` for `cargo run` too, and
/// `CARGO_TARGET_TMPDIR` only while compiling.) The simulator is a `libcuda_pinned_sim*.so`
/// (`cuda_pinned_sim*.dll` on Windows), where cargo puts a dependency's shared library: in `deps/` beside the
/// test binaries (with a hash in its name for a crate from a registry or git), and in the profile's folder
/// for a build of the workspace that has it.
fn simulator_hint(library: Library, exe: &Path, listing: &[PathBuf]) -> Option<String> {
    let var = library.override_var();
    let simulator = listing.iter().find(|path| is_simulator(path));
    if is_test_binary(exe) {
        let set = match simulator {
            Some(path) => format!("set {var} to the simulator's library: {}", path.display()),
            None => format!(
                "set {var} to the simulator's library (cargo builds a libcuda_pinned_sim*.so beside the test \
                 binaries of a crate that has cuda-pinned-sim as a dev-dependency)"
            ),
        };
        return Some(format!(
            "This is a test binary: to run it on the simulated driver, call `cuda_pinned_sim::install()?` at the \
             start of the test (`cuda_pinned_sim::install()?.exclusive()` in a test that injects faults or reads \
             violations), with cuda-pinned-sim in [dev-dependencies]; or {set}"
        ));
    }
    simulator.map(|path| {
        format!(
            "The simulated driver (cuda-pinned-sim) is built beside this program: set {var}={} to run on it",
            path.display()
        )
    })
}

/// Whether `exe` is where cargo puts a test binary: `deps/<name>-<hash>`, the hash 16 hexadecimal digits.
pub(crate) fn is_test_binary(exe: &Path) -> bool {
    let in_deps = exe
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|dir| dir == "deps");
    let hashed = exe
        .file_stem()
        .and_then(OsStr::to_str)
        .and_then(|stem| stem.rsplit_once('-'))
        .is_some_and(|(name, hash)| {
            !name.is_empty() && hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())
        });
    in_deps && hashed
}

/// Whether `path` is named as a build of the simulator: `libcuda_pinned_sim.so`, or with a `-<hash>` before
/// the suffix.
fn is_simulator(path: &Path) -> bool {
    let (prefix, suffix) = (std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    path.file_name()
        .and_then(OsStr::to_str)
        .and_then(|name| name.strip_prefix(prefix))
        .and_then(|name| name.strip_prefix("cuda_pinned_sim"))
        .and_then(|rest| rest.strip_suffix(suffix))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: &str = "/w/target/debug/deps/downstream_test-0123456789abcdef";

    fn paths(paths: &[&str]) -> Vec<PathBuf> {
        paths.iter().map(PathBuf::from).collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_test_binary_is_told_how_to_install_the_simulator_and_where_it_is() {
        let listing = paths(&[
            "/w/target/debug/deps/downstream_test-0123456789abcdef.d",
            "/w/target/debug/deps/libcuda_pinned_sim-fedcba9876543210.so",
            "/w/target/debug/libcuda_pinned_sim.so",
        ]);
        let hint = simulator_hint(Library::Driver, Path::new(TEST), &listing).expect("a hint");
        assert!(
            hint.starts_with("This is a test binary: to run it on the simulated driver, call `cuda_pinned_sim::install()?`"),
            "{hint}"
        );
        assert!(
            hint.contains("`cuda_pinned_sim::install()?.exclusive()`"),
            "{hint}"
        );
        assert!(
            hint.ends_with(
                "set CUDA_PINNED_LIBCUDA to the simulator's library: \
                 /w/target/debug/deps/libcuda_pinned_sim-fedcba9876543210.so"
            ),
            "{hint}"
        );
        // No simulator built: the same, without a path.
        let hint = simulator_hint(Library::Runtime, Path::new(TEST), &paths(&[])).expect("a hint");
        assert!(
            hint.contains("call `cuda_pinned_sim::install()?`"),
            "{hint}"
        );
        assert!(
            hint.contains("set CUDA_PINNED_LIBCUDART to the simulator's library (cargo builds"),
            "{hint}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_program_beside_the_simulator_is_told_its_path() {
        let hint = simulator_hint(
            Library::Driver,
            Path::new("/w/target/release/pinbench"),
            &paths(&[
                "/w/target/release/pinbench",
                "/w/target/release/libcuda_pinned_sim.so",
            ]),
        )
        .expect("a hint");
        assert_eq!(
            hint,
            "The simulated driver (cuda-pinned-sim) is built beside this program: set \
             CUDA_PINNED_LIBCUDA=/w/target/release/libcuda_pinned_sim.so to run on it"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn any_other_program_gets_no_hint() {
        // Control: a program that is neither a test binary nor beside a build of the simulator, among files
        // that are named almost like one.
        let near_misses = paths(&[
            "/usr/local/bin/libcuda_pinned_sim.d",
            "/usr/local/bin/libcuda_pinned_simulator.so",
            "/usr/local/bin/libcuda_pinned_sim-0123.rlib",
            "/usr/local/bin/cuda_pinned_sim.so",
            "/usr/local/libcuda.so.1",
        ]);
        for exe in [
            "/usr/local/bin/app",
            // In a folder named deps, but not named as cargo names a test binary.
            "/opt/deps/app",
            "/opt/deps/app-0123",
            "/opt/deps/app-0123456789abcdeg",
            // Named as a test binary, but not in deps/.
            "/w/target/debug/app-0123456789abcdef",
        ] {
            assert_eq!(
                simulator_hint(Library::Driver, Path::new(exe), &near_misses),
                None,
                "{exe}"
            );
        }
        // The same listing with the simulator in it: a hint.
        let mut listing = near_misses;
        listing.push(PathBuf::from("/usr/local/bin/libcuda_pinned_sim.so"));
        assert!(
            simulator_hint(Library::Driver, Path::new("/usr/local/bin/app"), &listing).is_some()
        );
    }
}
