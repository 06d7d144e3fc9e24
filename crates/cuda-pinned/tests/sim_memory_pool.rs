//! The crate's memory pool of a device is made on the first stream-ordered allocation there. Where making it
//! fails, that allocation is an `Err` saying so, and the next allocation tries again. A test binary of its own:
//! the pool, once made, is kept while any handle of the device's context lives, which other tests' could be.
//!
//! Only without feature `gpu`: faults are injected by the simulated driver.
#![cfg(not(feature = "gpu"))]

mod common;

use common::{data, serial};
use cuda_pinned::{Context, DeviceBuffer, Stream};

#[test]
fn a_pool_that_cannot_be_made_is_an_error_and_is_tried_again() {
    let _serial = serial();
    let sim = common::sim().expect("the simulated driver");
    let ctx = Context::on(0).unwrap();
    let s = Stream::new(&ctx).unwrap();
    for spec in [
        "cuMemPoolCreate:1:CUDA_ERROR_OUT_OF_MEMORY",
        "cuMemPoolSetAttribute:1:CUDA_ERROR_NOT_SUPPORTED",
    ] {
        sim.fail(spec).unwrap();
        let error = DeviceBuffer::<u32>::zeroed(&s, 64)
            .err()
            .unwrap_or_else(|| panic!("{spec}: the allocation succeeded"));
        sim.clear_faults();
        let message = error.to_string();
        assert!(
            message.contains("creating the memory pool of device 0"),
            "{spec}: {message}"
        );
    }
    let want = data(64, 3);
    let mut buffer = DeviceBuffer::<u32>::zeroed(&s, 64).unwrap();
    s.upload_pageable(&want, &mut buffer).unwrap();
    let mut got = vec![0; 64];
    s.download_pageable(&buffer, &mut got).unwrap();
    assert_eq!(got, want);
    drop(buffer);
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}
