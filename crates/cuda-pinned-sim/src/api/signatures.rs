//! The compile-time check that each exported driver function has the type the crate's bindings give it.

use super::context::*;
use super::copy::*;
use super::device::*;
use super::host::*;
use super::memory::*;
use super::modules::*;
use super::pool::*;
use super::streams::*;
use crate::sys::DriverApi;

/// Each exported function has exactly the type of its field in the crate's generated `DriverApi`: this
/// does not compile otherwise.
#[allow(dead_code, reason = "a compile-time check")]
fn signatures(api: &DriverApi) {
    fn same<T>(_: &Result<T, libloading::Error>, _: T) {}
    macro_rules! check {
        ($($f:ident),* $(,)?) => { $(same(&api.$f, $f);)* };
    }
    check!(
        cuGetErrorString,
        cuGetErrorName,
        cuInit,
        cuDriverGetVersion,
        cuDeviceGet,
        cuDeviceGetCount,
        cuDeviceGetName,
        cuDeviceGetUuid_v2,
        cuDeviceTotalMem_v2,
        cuDeviceGetAttribute,
        cuDeviceGetMemPool,
        cuDeviceGetDefaultMemPool,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxSetFlags_v2,
        cuDevicePrimaryCtxGetState,
        cuCtxCreate_v4,
        cuCtxDestroy_v2,
        cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxGetDevice,
        cuCtxSynchronize,
        cuCtxGetStreamPriorityRange,
        cuMemGetInfo_v2,
        cuMemAlloc_v2,
        cuMemFree_v2,
        cuMemFreeHost,
        cuMemHostAlloc,
        cuMemHostGetDevicePointer_v2,
        cuMemHostGetFlags,
        cuDeviceGetPCIBusId,
        cuMemHostRegister_v2,
        cuMemHostUnregister,
        cuMemcpyHtoD_v2,
        cuMemcpyDtoH_v2,
        cuMemcpyDtoD_v2,
        cuMemcpyAsync,
        cuMemcpyHtoDAsync_v2,
        cuMemcpyDtoHAsync_v2,
        cuMemcpyDtoDAsync_v2,
        cuMemcpyPeerAsync,
        cuDeviceCanAccessPeer,
        cuCtxEnablePeerAccess,
        cuCtxDisablePeerAccess,
        cuMemcpyBatchAsync_v2,
        cuMemcpy2DAsync_v2,
        cuMemcpy3DAsync_v2,
        cuMemsetD8Async,
        cuMemsetD16Async,
        cuMemsetD32Async,
        cuStreamWriteValue32_v2,
        cuMemFreeAsync,
        cuMemAllocAsync,
        cuMemAllocFromPoolAsync,
        cuMemPoolCreate,
        cuMemPoolDestroy,
        cuMemPoolTrimTo,
        cuMemPoolSetAttribute,
        cuMemPoolGetAttribute,
        cuMemPoolSetAccess,
        cuMemPoolGetAccess,
        cuPointerGetAttribute,
        cuPointerGetAttributes,
        cuStreamCreate,
        cuStreamCreateWithPriority,
        cuStreamGetPriority,
        cuStreamGetFlags,
        cuStreamWaitEvent,
        cuStreamQuery,
        cuStreamSynchronize,
        cuStreamDestroy_v2,
        cuEventCreate,
        cuEventRecord,
        cuEventRecordWithFlags,
        cuEventQuery,
        cuEventSynchronize,
        cuEventDestroy_v2,
        cuEventElapsedTime_v2,
        cuLaunchHostFunc,
        cuModuleLoadData,
        cuModuleLoadDataEx,
        cuModuleUnload,
        cuModuleGetFunction,
        cuFuncLoad,
        cuFuncIsLoaded,
        cuFuncGetParamInfo,
        cuFuncGetAttribute,
        cuFuncGetName,
        cuLaunchKernel,
        cuGetProcAddress_v2,
    );
    use crate::graph::*;
    check!(
        cuStreamBeginCapture_v2,
        cuStreamEndCapture,
        cuStreamIsCapturing,
        cuStreamGetCaptureInfo_v3,
        cuStreamUpdateCaptureDependencies_v2,
        cuGraphInstantiateWithFlags,
        cuGraphUpload,
        cuGraphLaunch,
        cuGraphExecDestroy,
        cuGraphDestroy,
    );
    use crate::nodes::*;
    check!(
        cuGraphGetNodes,
        cuGraphNodeGetType,
        cuGraphKernelNodeGetParams_v2,
        cuGraphKernelNodeSetParams_v2,
        cuGraphExecKernelNodeSetParams_v2,
        cuGraphMemcpyNodeGetParams,
        cuGraphMemcpyNodeSetParams,
        cuGraphExecMemcpyNodeSetParams,
        cuGraphMemsetNodeGetParams,
        cuGraphMemsetNodeSetParams,
        cuGraphExecMemsetNodeSetParams,
    );
}
