//! Copies between two simulated devices that cannot access each other's memory: [`Stream::copy`] stages them
//! through page-locked memory, a download on one device and an upload on the other, in the copying stream's
//! order and waited for by later work, both ways and for odd sizes.
//!
//! Only without feature `gpu`: the lent GPU machines' devices all reach each other.
//!
//! [`Stream::copy`]: cuda_pinned::Stream::copy
#![cfg(not(feature = "gpu"))]

#[macro_use]
mod common;
#[path = "common/program.rs"]
mod program;
#[path = "common/program_cases.rs"]
mod program_cases;

use common::devices::{PEER_LENGTHS, peer_copy};
use common::faults::each_call_fails;
use common::{Serial, serial};
use cuda_pinned::{Context, DeviceBuffer, Pinned};

fn setup() -> Serial {
    cuda_pinned_sim::install_with(
        cuda_pinned_sim::Settings::new()
            .devices(2)
            .peer_access(false),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    serial()
}

/// Random programs on the two devices (tests/common/program.rs, as `gpu_props` runs them), every copy between
/// the devices staged.
#[test]
fn random_programs_with_staged_copies_between_devices_match_the_model() {
    let _serial = setup();
    program_cases::check_random_programs(&[Context::on(0).unwrap(), Context::on(1).unwrap()]);
}

#[test]
fn copies_between_devices_without_peer_access_are_staged_and_arrive_whole() {
    let _serial = setup();
    let contexts = [Context::on(0).unwrap(), Context::on(1).unwrap()];
    assert!(!contexts[0].can_access_peer(&contexts[1]).unwrap());
    assert!(!contexts[0].enable_peer_access(&contexts[1]).unwrap());
    for len in PEER_LENGTHS {
        for (from, to) in [(0, 1), (1, 0)] {
            for on_source in [false, true] {
                peer_copy(&contexts, from, to, len, on_source);
            }
        }
    }
}

/// A staged copy makes no unrelated stream wait, and waits for none: it completes on the devices while
/// another stream of each device is held.
#[test]
fn staged_copies_wait_for_no_unrelated_stream() {
    let _serial = setup();
    common::devices::copy_beside_held_streams(&[Context::on(0).unwrap(), Context::on(1).unwrap()]);
}

/// Each driver call of staged copies both ways (two chunks each) fails in turn: an `Err` comes back, nothing
/// leaks but what the crate leaks on purpose, and no memory is freed under queued work (`each_call_fails`).
#[test]
fn every_failing_call_of_a_staged_copy_is_an_error() {
    let mut serial = setup();
    const LEN: usize = (4 << 20) / 4 + 1;
    each_call_fails(&mut serial, "staged copies", |f| {
        let host = bounded!(Pinned::from_slice(&f.ctx, &vec![5u32; LEN]))?;
        let mut d0 = bounded!(DeviceBuffer::<u32>::uninit(&f.a, LEN))?;
        let mut d1 = bounded!(DeviceBuffer::<u32>::uninit(&f.c, LEN))?;
        bounded!(f.a.upload(&host, &mut d0))?;
        // On the destination's stream, then on the source's.
        bounded!(f.c.copy(&d0, &mut d1))?;
        bounded!(f.c.copy(&d1, &mut d0))?;
        let mut back = bounded!(Pinned::<u32>::zeroed(&f.ctx, LEN))?;
        bounded!(f.a.download(&d0, &mut back))
    });
}
