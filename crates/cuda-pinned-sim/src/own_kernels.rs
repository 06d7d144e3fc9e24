//! The stand-ins of `cuda-pinned`'s own kernels (its `cuda/gather.cu`, which its `Gatherer` loads as PTX), built
//! into the library: every program that loads the simulator, through [`crate::install`] or through
//! `CUDA_PINNED_LIBCUDA`, finds them registered (a test may still replace one with
//! [`crate::Control::register_kernel`]).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

use crate::KernelCall;
use crate::kernel::StandIn;

/// The stand-ins registered so far, by name, as the library's table holds them.
#[derive(Default)]
pub(crate) struct Registry(pub(crate) HashMap<Vec<u8>, Arc<StandIn>>);

impl Registry {
    /// As [`crate::Control::register_kernel`], into this table.
    fn register_kernel<F>(
        &mut self,
        name: &str,
        param_sizes: &[usize],
        stand_in: F,
    ) -> Result<(), String>
    where
        F: Fn(&mut KernelCall<'_>) + Send + Sync + 'static,
    {
        let name =
            CString::new(name).map_err(|_| format!("the kernel name {name:?} holds a NUL"))?;
        let stand_in = StandIn::new(name.clone(), param_sizes.to_vec(), stand_in)?;
        self.0.insert(name.into_bytes(), Arc::new(stand_in));
        Ok(())
    }
}

/// The first `N` parameters of a launch of the crate's own kernels, each 8 bytes (a pointer or a 64-bit value).
fn words<const N: usize>(call: &KernelCall<'_>) -> [u64; N] {
    std::array::from_fn(|i| call.arg::<u64>(i))
}

/// The stand-ins of cuda-pinned's own gather kernels (`cuda/gather.cu` of that crate, which its `Gatherer`
/// loads as PTX): out row `k` (or `positions[k]`) is table row `indices[k]`, whatever the grid (the kernels
/// stride over the whole batch).
pub(crate) fn register(control: &mut Registry) -> Result<(), String> {
    for width in [1u64, 2, 4, 8, 16] {
        control.register_kernel(
            &format!("cuda_pinned_gather_{width}"),
            &[8; 6],
            move |call| {
                let [table, row_vecs, indices, positions, count, out] = words(call);
                let row_bytes = row_vecs * width;
                let count = usize::try_from(count).unwrap_or(usize::MAX);
                let indices = call.read::<u32>(indices, count);
                let positions = (positions != 0).then(|| call.read::<u32>(positions, count));
                let (Some(&first), Some(&last)) = (indices.iter().min(), indices.iter().max())
                else {
                    return;
                };
                // The rows the batch reads, and the output, each reached once: a lookup per row made a
                // gather of 128 Ki rows take a second in a debug build.
                let row = row_bytes as usize;
                let rows = call.read::<u8>(
                    table + u64::from(first) * row_bytes,
                    (last - first + 1) as usize * row,
                );
                let mut written = call.read::<u8>(out, count * row);
                for (k, &index) in indices.iter().enumerate() {
                    let to = positions.as_ref().map_or(k, |p| p[k] as usize);
                    let from = (index - first) as usize * row;
                    written[to * row..][..row].copy_from_slice(&rows[from..][..row]);
                }
                call.write(out, &written);
            },
        )?;
    }
    register_sort_kernels(control)
}

/// The stand-ins of the kernels that sort a gather's indices on the device (`cuda/gather.cu` of cuda-pinned):
/// bins counted by bucket, tile sums (after the grid's tiles of bins), each bin's first slot, and the scatter
/// into `order` (the sorted indices, then their positions). The scatter keeps the batch's order within a bucket,
/// one of the orders the device's atomics may give.
fn register_sort_kernels(control: &mut Registry) -> Result<(), String> {
    const TILE: u64 = 256 * 16;
    let bucket = |index: u32, row_bytes: u64, shift: u64| (u64::from(index) * row_bytes) >> shift;
    control.register_kernel("cuda_pinned_gather_count", &[8; 5], move |call| {
        let [indices, count, row_bytes, shift, bins] = words(call);
        let indices = call.read::<u32>(indices, count as usize);
        let Some(&last) = indices.iter().max() else {
            return;
        };
        // The bins the batch touches, read and written once.
        let mut counts = call.read::<u32>(bins, bucket(last, row_bytes, shift) as usize + 1);
        for index in indices {
            counts[bucket(index, row_bytes, shift) as usize] += 1;
        }
        call.write(bins, &counts);
    })?;
    control.register_kernel("cuda_pinned_gather_tiles", &[8], move |call| {
        let (bins, tiles) = (call.arg::<u64>(0), u64::from(call.grid()[0]));
        let sums: Vec<u32> = (0..tiles)
            .map(|t| {
                call.read::<u32>(bins + 4 * t * TILE, TILE as usize)
                    .iter()
                    .sum()
            })
            .collect();
        call.write(bins + 4 * tiles * TILE, &sums);
    })?;
    control.register_kernel("cuda_pinned_gather_starts", &[8], move |call| {
        let (bins, tiles) = (call.arg::<u64>(0), u64::from(call.grid()[0]));
        let sums = call.read::<u32>(bins + 4 * tiles * TILE, tiles as usize);
        let mut counts = call.read::<u32>(bins, (tiles * TILE) as usize);
        // Each tile starts after the tiles' sums before it, as the device's blocks compute it.
        let mut start = 0u32;
        for (tile, sum) in counts.chunks_mut(TILE as usize).zip(sums) {
            let mut slot = start;
            for bin in tile {
                let n = *bin;
                *bin = slot;
                slot += n;
            }
            start += sum;
        }
        call.write(bins, &counts);
    })?;
    control.register_kernel("cuda_pinned_gather_scatter", &[8; 6], move |call| {
        let [indices, count, row_bytes, shift, bins, order] = words(call);
        let indices = call.read::<u32>(indices, count as usize);
        let Some(&last) = indices.iter().max() else {
            return;
        };
        let mut slots = call.read::<u32>(bins, bucket(last, row_bytes, shift) as usize + 1);
        let mut sorted = call.read::<u32>(order, 2 * count as usize);
        for (k, index) in (0u32..).zip(indices) {
            let slot = &mut slots[bucket(index, row_bytes, shift) as usize];
            sorted[*slot as usize] = index;
            sorted[(count + u64::from(*slot)) as usize] = k;
            *slot += 1;
        }
        call.write(bins, &slots);
        call.write(order, &sorted);
    })
}
