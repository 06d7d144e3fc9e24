//! Random programs against a CPU model: proptest generates sequences of copies, kernels, event waits, host
//! accesses and buffer replacements over 2-4 streams and a few device and pinned buffers of assorted sizes,
//! on one device or two, runs them on the GPU (or the simulated driver), and checks every element against a
//! model that applies the operations in program order (tests/common/program.rs, which the fuzz target
//! `sim_programs` shares). On the simulated driver the programs have two devices to use; on a GPU machine as
//! many as it has, up to two.
//!
//! The generator and its settings are in tests/common/program_cases.rs (`CUDA_PINNED_PROP_CASES`,
//! `CUDA_PINNED_PROP_SEED`).

mod common;
#[path = "common/program.rs"]
mod program;
#[path = "common/program_cases.rs"]
mod program_cases;

use std::time::Duration;

#[cfg(not(feature = "gpu"))]
use common::kernels;
use common::{compare, data, serial_on_two_devices};
#[cfg(feature = "gpu")]
use cuda_pinned::kernels;
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
use program::MAX_DEVICES;

fn context() -> Context {
    common::device(0)
}

/// The primary contexts of the devices programs may use: all of them, up to [`MAX_DEVICES`].
fn contexts() -> Vec<Context> {
    let count = common::device_count();
    (0..count.min(MAX_DEVICES))
        .map(|ordinal| Context::on(ordinal).unwrap())
        .collect()
}

#[test]
fn random_programs_over_several_streams_match_the_model() {
    let _serial = serial_on_two_devices();
    program_cases::check_random_programs(&contexts());
}

/// A fixed adversarial program, whatever proptest generates: a slow producer on stream A writes `d0`, a
/// consumer on stream B copies `d0` into `d1`, a reader on stream C downloads `d1`, and A then overwrites `d0`
/// while B may still be reading it. Every step needs a device-side wait on another stream.
#[test]
fn a_slow_producer_a_consumer_and_a_reader_on_three_streams() {
    let _serial = serial_on_two_devices();
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
