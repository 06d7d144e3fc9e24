//! A launch's grid and block ([`LaunchConfig`]), checked against the device's limits.

use super::module::Kernel;
use crate::driver::{Context, calls};
use crate::error::{Error, Result};
use crate::sys::{CUdevice_attribute, CUfunction, CUfunction_attribute};

/// What a launch of a kernel may ask for on its device.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) grid: [u32; 3],
    pub(super) block: [u32; 3],
    pub(super) threads_per_block: u32,
    pub(super) dynamic_shared: u32,
}

impl Limits {
    pub(super) fn of(context: &Context, function: CUfunction) -> Result<Limits> {
        use CUdevice_attribute as D;
        let device = context.device();
        let attribute = |a| device.attribute(a);
        let function_attribute =
            |a| calls::func_get_attribute(a, function).map(|v| u32::try_from(v).unwrap_or(0));
        Ok(Limits {
            grid: [
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            block: [
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ],
            threads_per_block: function_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            )?,
            dynamic_shared: function_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            )?,
        })
    }
}

/// The shape of a launch: a grid of blocks of threads, and the dynamic shared memory each block gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in x, y and z.
    pub grid: [u32; 3],
    /// Threads per block in x, y and z.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_memory: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch of `grid` blocks of `block` threads, with no dynamic shared memory.
    #[must_use]
    pub fn new(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_memory: 0,
        }
    }

    /// One thread per element of `elements`, in blocks of `block` threads (the last block may be partial; at
    /// least one block).
    ///
    /// # Errors
    /// An invalid-argument error if `block` is 0 or the grid would need more than `u32::MAX` blocks.
    pub fn for_elements(elements: usize, block: u32) -> Result<LaunchConfig> {
        if block == 0 {
            return Err(Error::invalid(
                "LaunchConfig::for_elements: a block of 0 threads",
            ));
        }
        let blocks = elements.div_ceil(block as usize).max(1);
        let grid = u32::try_from(blocks).map_err(|_| {
            Error::invalid(format_args!(
                "LaunchConfig::for_elements: {elements} elements need {blocks} blocks of {block}, more than a \
                 grid's x dimension holds; use a grid-stride loop"
            ))
        })?;
        Ok(LaunchConfig::new(grid, block))
    }

    /// Checks the launch against the kernel's and device's limits.
    pub(super) fn check(&self, kernel: &Kernel) -> Result<()> {
        let limits = &kernel.limits;
        let within = |dims: [u32; 3], max: [u32; 3]| {
            dims.iter().zip(max).all(|(&d, m)| (1..=m).contains(&d))
        };
        let threads = self.block.iter().map(|&d| u64::from(d)).product::<u64>();
        if within(self.grid, limits.grid)
            && within(self.block, limits.block)
            && threads <= u64::from(limits.threads_per_block)
            && self.shared_memory <= limits.dynamic_shared
        {
            return Ok(());
        }
        self.refuse(kernel)
    }

    /// What [`LaunchConfig::check`] found over a limit, as an error (or nothing, where a raised shared-memory
    /// limit allows the launch after all).
    #[cold]
    fn refuse(&self, kernel: &Kernel) -> Result<()> {
        let limits = &kernel.limits;
        let name = &kernel.name;
        let fail = |what: String| {
            Err(Error::invalid(format_args!(
                "launching `{name}` with grid {:?} and block {:?}: {what}; nothing was enqueued",
                self.grid, self.block
            )))
        };
        if self.grid.contains(&0) || self.block.contains(&0) {
            return fail("every dimension must be at least 1".into());
        }
        for axis in 0..3 {
            let xyz = ["x", "y", "z"][axis];
            if self.block[axis] > limits.block[axis] {
                return fail(format!(
                    "the block's {xyz} is over the device's {}",
                    limits.block[axis]
                ));
            }
            if self.grid[axis] > limits.grid[axis] {
                return fail(format!(
                    "the grid's {xyz} is over the device's {}",
                    limits.grid[axis]
                ));
            }
        }
        let threads = self.block.iter().map(|&d| u64::from(d)).product::<u64>();
        if threads > u64::from(limits.threads_per_block) {
            return fail(format!(
                "{threads} threads per block, over the kernel's limit of {}",
                limits.threads_per_block
            ));
        }
        // The limit read at lookup may have been raised since (cuFuncSetAttribute on `Kernel::as_raw`): read it
        // again before refusing.
        let over_limit = self.shared_memory > limits.dynamic_shared
            && calls::func_get_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernel.raw,
            )
            .map_or(true, |now| i64::from(self.shared_memory) > i64::from(now));
        if over_limit {
            return fail(format!(
                "{} bytes of dynamic shared memory, over the kernel's limit of {} (raise it with \
                 cuFuncSetAttribute and CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                self.shared_memory, limits.dynamic_shared
            ));
        }
        Ok(())
    }
}
