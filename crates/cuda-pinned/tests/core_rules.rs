//! Regressions of two attacks on the core that reached undefined behaviour from safe code: an element type
//! aligned beyond what the memory guarantees, and a pageable copy whose call failed after the copy was
//! enqueued, returning while the copy could still read or write the caller's memory.

mod common;

use common::serial;
use cuda_pinned::{Context, DeviceBuffer, Pinned, PinnedBuilder, Registered, Stream};

fn context() -> Context {
    common::device(0)
}

/// An element aligned to 64 KiB: more than the page the driver aligns pinned memory to, and than the 256 bytes
/// of device allocations.
#[repr(C, align(65536))]
#[derive(Clone, Copy)]
struct Huge([u8; 65536]);

// SAFETY: a byte array, with no padding (its size is its alignment), so every bit pattern is valid, zero too.
unsafe impl bytemuck::Zeroable for Huge {}
// SAFETY: as above; `Copy`, `repr(C)`, `'static`.
unsafe impl bytemuck::Pod for Huge {}

/// An element aligned to a page: as much as pinned memory guarantees.
#[repr(C, align(4096))]
#[derive(Clone, Copy)]
struct Paged([u8; 4096]);

// SAFETY: as for `Huge`.
unsafe impl bytemuck::Zeroable for Paged {}
// SAFETY: as for `Huge`.
unsafe impl bytemuck::Pod for Paged {}

#[test]
fn over_aligned_elements_are_refused_where_the_memory_cannot_hold_them() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    // Sixteen tries: a page-aligned address is 64 KiB-aligned one time in sixteen, so one lucky allocation
    // does not hide a missing check.
    for _ in 0..16 {
        let e = Pinned::<Huge>::zeroed(&ctx, 1).unwrap_err();
        assert!(e.to_string().contains("aligned to 65536 bytes"), "{e}");
        let e = PinnedBuilder::new(&ctx)
            .write_combined(true)
            .zeroed::<Huge>(1)
            .unwrap_err();
        assert!(e.to_string().contains("aligned to 65536 bytes"), "{e}");
        let e = DeviceBuffer::<Huge>::uninit(&stream, 1).unwrap_err();
        assert!(e.to_string().contains("aligned to 65536 bytes"), "{e}");
    }
    // What the memory does guarantee is accepted, and the slices are aligned.
    for _ in 0..4 {
        let paged = Pinned::<Paged>::zeroed(&ctx, 3).unwrap();
        assert!(paged.as_slice().unwrap().as_ptr().is_aligned());
    }
    // A Vec is aligned for its elements whatever they are, so registering one always works.
    let registered = Registered::new(&ctx, vec![Huge([7; 65536]); 2]).unwrap();
    let slice = registered.as_slice().unwrap();
    assert!(slice.as_ptr().is_aligned() && slice[1].0[65535] == 7);
    drop(registered);
    ctx.check_deferred_errors().unwrap();
}

/// On the simulated driver only: failures are injected into the calls that follow the enqueue of a pageable
/// copy (the ledger's end event, the synchronization), whose memory is a slice of pinned memory, so the copy
/// is really asynchronous. The call must not return before the copy has run: afterwards the pinned buffer is
/// dropped and freed, which the simulator reports as a violation if the copy is still queued, and the data it
/// wrote is checked.
#[cfg(not(feature = "gpu"))]
mod after_an_error {
    use super::*;
    use common::{data, sim, spin};
    use cuda_pinned::{Ledger, Result};

    /// Runs `copy` once to trace its calls, then once with the `nth` call of `function` that follows the
    /// copy's enqueue (`enqueue`) failing; returns that run's result.
    fn fail_after_enqueue(
        enqueue: &str,
        function: &str,
        copy: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let sim = sim().expect("these tests run on the simulated driver");
        copy().unwrap();
        sim.trace_start();
        copy().unwrap();
        let calls = sim.trace_stop();
        let at = calls
            .iter()
            .position(|c| c == enqueue)
            .unwrap_or_else(|| panic!("no {enqueue} in {calls:?}"));
        let after = calls[at..]
            .iter()
            .position(|c| c == function)
            .unwrap_or_else(|| panic!("no {function} after {enqueue} in {calls:?}"));
        let nth = calls[..at + after + 1]
            .iter()
            .filter(|c| *c == function)
            .count();
        sim.fail(&format!("{function}:{nth}:CUDA_ERROR_UNKNOWN"))
            .unwrap();
        let result = copy();
        sim.clear_faults();
        result
    }

    #[test]
    fn a_failed_pageable_upload_returns_only_once_its_copy_has_read_the_memory() {
        for function in ["cuEventRecord", "cuStreamSynchronize"] {
            let _serial = serial();
            let ctx = context();
            let ledger = Ledger::new();
            let stream = Stream::with_ledger(&ctx, &ledger).unwrap();
            let want = data(1 << 16, 3);
            let pinned = Pinned::from_slice(&ctx, &want).unwrap();
            let mut device = DeviceBuffer::<u32>::zeroed(&stream, want.len()).unwrap();
            let result = fail_after_enqueue("cuMemcpyHtoDAsync_v2", function, &mut || {
                // Queued behind 100 ms of other work, so that it is still queued when the failing call comes.
                spin(&stream, 100);
                stream.upload_pageable(pinned.as_slice()?, &mut device)
            });
            let e = result.expect_err(function);
            assert!(
                e.to_string().contains("CUDA_ERROR_UNKNOWN"),
                "{function}: {e}"
            );
            // Freed at once, on the release thread: a violation if the copy has not read it yet.
            drop(pinned);
            ctx.synchronize().unwrap();
            let mut back = vec![0u32; want.len()];
            stream.download_pageable(&device, &mut back).unwrap();
            assert!(back == want, "{function}: the upload's data");
        }
    }

    #[test]
    fn a_failed_pageable_download_returns_only_once_its_copy_has_written_the_memory() {
        for function in ["cuEventRecord", "cuStreamSynchronize"] {
            let _serial = serial();
            let ctx = context();
            let ledger = Ledger::new();
            let stream = Stream::with_ledger(&ctx, &ledger).unwrap();
            let want = data(1 << 16, 4);
            let source = Pinned::from_slice(&ctx, &want).unwrap();
            let mut device = DeviceBuffer::<u32>::zeroed(&stream, want.len()).unwrap();
            stream.upload(&source, &mut device).unwrap();
            let mut pinned = Pinned::<u32>::zeroed(&ctx, want.len()).unwrap();
            let result = fail_after_enqueue("cuMemcpyDtoHAsync_v2", function, &mut || {
                spin(&stream, 100);
                let out = pinned.as_mut_slice()?;
                out.fill(0);
                stream.download_pageable(&device, out)?;
                Ok(())
            });
            let e = result.expect_err(function);
            assert!(
                e.to_string().contains("CUDA_ERROR_UNKNOWN"),
                "{function}: {e}"
            );
            // The copy has run: what the slice holds now is final, whatever the stream does next.
            let seen = pinned.as_slice().unwrap().to_vec();
            spin(&stream, 50);
            stream.synchronize().unwrap();
            assert!(
                seen == want,
                "{function}: the download had not written it all"
            );
            assert!(pinned.as_slice().unwrap() == want.as_slice());
            drop(pinned);
            ctx.synchronize().unwrap();
        }
    }
}
