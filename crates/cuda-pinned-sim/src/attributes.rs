//! Device attributes: those of a recent data-centre GPU where the crate or a test may ask, zero elsewhere.

use crate::sys::CUdevice_attribute as A;

/// Threads in a block, at most (what `cuLaunchKernel` accepts).
pub(crate) const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// A block's dimensions x, y, z, at most.
pub(crate) const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
/// A grid's dimensions x, y, z, at most.
pub(crate) const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];
/// Bytes of shared memory a block may have without opting in to more.
pub(crate) const MAX_SHARED: u32 = 48 * 1024;

pub(crate) fn value(attribute: A, device: usize) -> i32 {
    match attribute {
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => 132,
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => MAX_THREADS_PER_BLOCK as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X => MAX_BLOCK[0] as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => MAX_BLOCK[1] as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => MAX_BLOCK[2] as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => MAX_GRID[0] as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y => MAX_GRID[1] as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => MAX_GRID[2] as i32,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => MAX_SHARED as i32,
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_755_000,
        A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
        | A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS => 1,
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => device as i32 + 1,
        _ => 0,
    }
}
