//! Random programs against a CPU model: proptest generates sequences of copies, kernels, event waits, host
//! accesses and buffer replacements over 2-4 streams and a few device and pinned buffers of assorted sizes,
//! on one device or two, runs them on the GPU (or the simulated driver), and checks every element against a
//! model that applies the operations in program order (tests/common/program.rs, which the fuzz target
//! `sim_programs` shares). On the simulated driver the programs have two devices to use; on a GPU machine as
//! many as it has, up to two.
//!
//! `CUDA_PINNED_PROP_CASES` sets the number of programs (48 by default), `CUDA_PINNED_PROP_SEED` the seed
//! of the generator (random by default; a failure reports the one it used).

mod common;
#[path = "common/program.rs"]
mod program;

use std::time::Duration;

#[cfg(not(feature = "gpu"))]
use common::kernels;
use common::{Serial, SplitMix64, compare, data, env_number, serial};
#[cfg(feature = "gpu")]
use cuda_pinned::kernels;
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
use program::{
    DEVICE_BUFFERS, MAX_DEVICES, MAX_SPIN_US, MAX_STREAMS, Op, PINNED_BUFFERS, Program, SIZES,
    run_program,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// [`common::serial`], with the simulated driver installed with two devices first.
fn setup() -> Serial {
    #[cfg(not(feature = "gpu"))]
    {
        cuda_pinned_sim::install_with(cuda_pinned_sim::Settings::new().devices(2))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    serial()
}

fn context() -> Context {
    Context::on(0).expect("a CUDA device under feature `gpu`")
}

/// The primary contexts of the devices programs may use: all of them, up to [`MAX_DEVICES`].
fn contexts() -> Vec<Context> {
    let count = cuda_pinned::Device::count().expect("a CUDA device under feature `gpu`");
    (0..count.min(MAX_DEVICES))
        .map(|ordinal| Context::on(ordinal).unwrap())
        .collect()
}

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

#[test]
fn random_programs_over_several_streams_match_the_model() {
    let _serial = setup();
    let contexts = contexts();
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
        run_program(&contexts, &program).map_err(TestCaseError::fail)
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

/// A fixed adversarial program, whatever proptest generates: a slow producer on stream A writes `d0`, a
/// consumer on stream B copies `d0` into `d1`, a reader on stream C downloads `d1`, and A then overwrites `d0`
/// while B may still be reading it. Every step needs a device-side wait on another stream.
#[test]
fn a_slow_producer_a_consumer_and_a_reader_on_three_streams() {
    let _serial = setup();
    let ctx = context();
    let (a, b, c) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let len = 1 << 20;
    let half = len / 2;
    let mut d0 = DeviceBuffer::<u32>::zeroed(&a, len).unwrap();
    let mut d1 = DeviceBuffer::<u32>::zeroed(&b, len).unwrap();
    let mut host = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    for round in 0..4u32 {
        let want = data(len, 1000 + u64::from(round));
        let overwrite = 0xA5A5_0001 + 2 * round;
        {
            let src = Pinned::from_slice(&ctx, &want).unwrap();
            kernels::spin(&a, Duration::from_millis(20)).unwrap();
            a.upload(&src, &mut d0).unwrap(); // runs only after the spin
            // `src` drops here, with the upload still queued behind the spin.
        }
        kernels::spin(&b, Duration::from_millis(5)).unwrap();
        b.copy(&d0, &mut d1).unwrap(); // must wait for A's upload
        c.download(&d1, &mut host).unwrap(); // must wait for B's copy
        kernels::fill(&a, &mut d0, overwrite).unwrap(); // must wait for B's read of d0
        compare(
            host.as_slice().unwrap(),
            &want,
            &format!("round {round}: d0 -> d1 -> host"),
        )
        .unwrap();
        let mut back = vec![0; len];
        c.download_pageable(&d0, &mut back).unwrap();
        compare(
            &back,
            &vec![overwrite; len],
            &format!("round {round}: the overwrite of d0 after B's read"),
        )
        .unwrap();
    }

    // The same through views: the front half of d0 produced slowly on A, copied into the back half of d1 on B,
    // downloaded into the front half of the host buffer on C.
    let want = data(half, 2000);
    let src = Pinned::from_slice(&ctx, &want).unwrap();
    kernels::spin(&a, Duration::from_millis(20)).unwrap();
    a.upload(&src, &mut d0.slice_mut(..half).unwrap()).unwrap();
    b.copy(
        &d0.slice(..half).unwrap(),
        &mut d1.slice_mut(half..).unwrap(),
    )
    .unwrap();
    c.download(
        &d1.slice(half..).unwrap(),
        &mut host.slice_mut(..half).unwrap(),
    )
    .unwrap();
    let got = host.as_slice().unwrap();
    compare(
        &got[..half],
        &want,
        "views: d0[..half] -> d1[half..] -> host[..half]",
    )
    .unwrap();
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}
