//! Device attributes: those of a recent data-centre GPU where the crate or a test may ask, zero elsewhere.

use crate::sys::CUdevice_attribute as A;

pub(crate) fn value(attribute: A, device: usize) -> i32 {
    match attribute {
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => 132,
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
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
