//! Random programs (tests/common/program.rs) drawn by proptest and checked against the model, for the test
//! binaries that run them under their own settings: `gpu_props` (a GPU, or the simulated driver with two
//! devices that reach each other) and `sim_staged_peer` (two simulated devices that do not, so that every copy
//! between them is staged). Included with `#[path]` beside `program`.
//!
//! `CUDA_PINNED_PROP_CASES` sets the number of programs (48 by default), `CUDA_PINNED_PROP_SEED` the seed
//! of the generator (random by default; a failure reports the one it used).

use cuda_pinned::Context;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use crate::common::{SplitMix64, env_number};
use crate::program::{
    DEVICE_BUFFERS, MAX_SPIN_US, MAX_STREAMS, Op, PINNED_BUFFERS, Program, SIZES, run_program,
};

/// One operation of a program.
fn op() -> impl Strategy<Value = Op> {
    let stream = 0..MAX_STREAMS;
    let device = 0..DEVICE_BUFFERS;
    let pinned = 0..PINNED_BUFFERS;
    let step = 1..DEVICE_BUFFERS;
    let pick = any::<u64>();
    let size = prop::option::weighted(0.5, 0..SIZES.len());
    prop_oneof![
        4 => (stream.clone(), pinned.clone(), device.clone(), pick)
            .prop_map(|(stream, from, to, pick)| Op::Upload { stream, from, to, pick }),
        4 => (stream.clone(), device.clone(), pinned.clone(), pick)
            .prop_map(|(stream, from, to, pick)| Op::Download { stream, from, to, pick }),
        5 => (stream.clone(), device.clone(), step.clone(), pick)
            .prop_map(|(stream, from, step, pick)| Op::Copy { stream, from, step, pick }),
        2 => (stream.clone(), device.clone(), pick)
            .prop_map(|(stream, to, pick)| Op::UploadPageable { stream, to, pick }),
        2 => (stream.clone(), device.clone(), pick)
            .prop_map(|(stream, from, pick)| Op::DownloadPageable { stream, from, pick }),
        3 => (stream.clone(), device.clone(), pick)
            .prop_map(|(stream, to, pick)| Op::Fill { stream, to, pick }),
        3 => (stream.clone(), device.clone(), step.clone(), pick, any::<u32>()).prop_map(
            |(stream, from, step, pick, add)| Op::Launch { stream, from, step, pick, add }
        ),
        7 => (stream.clone(), 1..=MAX_SPIN_US)
            .prop_map(|(stream, micros)| Op::Spin { stream, micros }),
        1 => (stream.clone(), 1..MAX_STREAMS)
            .prop_map(|(from, step)| Op::EventWait { from, step }),
        2 => pinned.clone().prop_map(|index| Op::HostRead { index }),
        2 => (pinned.clone(), pick).prop_map(|(index, pick)| Op::HostWrite { index, pick }),
        1 => pinned.clone().prop_map(|index| Op::TryHostRead { index }),
        1 => (pinned.clone(), pick).prop_map(|(index, pick)| Op::TryHostWrite { index, pick }),
        1 => (stream, device, size.clone(), any::<bool>(), any::<bool>()).prop_map(
            |(stream, index, size, filled, drop_first)| Op::ReplaceDevice {
                stream,
                index,
                size,
                filled,
                drop_first,
            }
        ),
        1 => (pinned, size, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(index, size, fresh, drop_first, portable)| Op::ReplacePinned {
                index,
                size,
                fresh,
                drop_first,
                portable,
            }
        ),
    ]
}

/// A program of 10 to 40 operations on up to `devices` devices.
fn program(devices: usize) -> impl Strategy<Value = Program> {
    (
        any::<u64>(),
        2..=MAX_STREAMS,
        1..=devices,
        0..SIZES.len(),
        prop::collection::vec(
            prop::option::weighted(0.3, 0..SIZES.len()),
            DEVICE_BUFFERS + PINNED_BUFFERS,
        ),
        prop::collection::vec(op(), 10..=40),
    )
        .prop_map(
            |(seed, streams, devices, common_size, sizes, ops)| Program {
                seed,
                streams,
                devices,
                common_size,
                sizes,
                ops,
            },
        )
}

/// Runs random programs on `contexts` (one per device; each program uses one device or all of them, up to
/// two) and panics with the shrunk program and the seed that reproduces the run if one disagrees with the model.
pub fn check_random_programs(contexts: &[Context]) {
    let cases =
        env_number("CUDA_PINNED_PROP_CASES").map_or(48, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let seed = env_number("CUDA_PINNED_PROP_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        SplitMix64(now ^ (u64::from(std::process::id()) << 32)).next()
    });
    let config = Config {
        cases,
        // The binary runs from a read-only copy on another machine: no regressions file.
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        // Each shrinking step runs a program on the GPU: bound the time spent on a failure.
        max_shrink_iters: 256,
        max_shrink_time: 30_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&program(contexts.len()), |program| {
        run_program(contexts, &program).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, program)) => panic!(
            "a program disagreed with the model (CUDA_PINNED_PROP_SEED={seed} reproduces the run)\n\
             {reason}\nthe program (shrunk): {program:#?}"
        ),
        Err(e) => panic!("CUDA_PINNED_PROP_SEED={seed}: {e}"),
    }
}
