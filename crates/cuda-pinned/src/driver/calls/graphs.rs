//! Stream capture and graphs: capturing, nodes and their parameters, instantiation and launches.

#![allow(unsafe_code)]

use crate::driver_call;
use crate::error::Result;
use crate::sys::{
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS, CUcontext, CUgraph,
    CUgraphExec, CUgraphNode, CUgraphNodeType, CUstream,
};

/// `cuStreamBeginCapture_v2` in the relaxed mode: work queued on `stream` from now on is recorded into a graph
/// rather than run, until `cuStreamEndCapture`. The relaxed mode lets every thread go on making the calls the
/// other modes forbid during a capture (pinning, unpinning, frees): the crate never makes them on memory the
/// capture uses (ARCHITECTURE.md, "Graphs").
pub(crate) fn stream_begin_capture(stream: CUstream) -> Result<()> {
    let mode = crate::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream (see the module docs).
    unsafe { driver_call!(cuStreamBeginCapture_v2(stream, mode)) }
}

/// `cuStreamEndCapture`: ends the capture `stream` began, returning its graph (which the caller destroys with
/// [`graph_destroy`]).
pub(crate) fn stream_end_capture(stream: CUstream) -> Result<CUgraph> {
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; an out-pointer to a local.
    unsafe { driver_call!(cuStreamEndCapture(stream, &mut graph)) }?;
    Ok(graph)
}

/// `cuStreamGetCaptureInfo_v3`: the nodes of the capture that work queued on `stream` next will depend on. An
/// invalid-argument error where the stream is not in an active capture.
pub(crate) fn stream_capture_dependencies(stream: CUstream) -> Result<Vec<CUgraphNode>> {
    let mut status = crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut nodes: *const CUgraphNode = std::ptr::null();
    let mut count = 0;
    // SAFETY: a live stream; out-pointers to locals; the other outputs are optional.
    unsafe {
        driver_call!(cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut nodes,
            std::ptr::null_mut(),
            &mut count,
        ))
    }?;
    if status != crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Err(crate::Error::invalid(
            "the stream is not in an active capture (it ended, or other code's call invalidated it)",
        ));
    }
    if nodes.is_null() || count == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: cuda.h: the array holds `count` nodes and stays valid until the next call on the stream.
    Ok(unsafe { std::slice::from_raw_parts(nodes, count) }.to_vec())
}

/// `cuStreamUpdateCaptureDependencies_v2` (add): makes work queued on the capturing `stream` next depend on
/// `nodes` too, which belong to the same capture.
pub(crate) fn stream_add_capture_dependencies(
    stream: CUstream,
    nodes: &[CUgraphNode],
) -> Result<()> {
    let flags =
        crate::sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES.0;
    // SAFETY: a live stream; the driver reads `nodes.len()` nodes (it takes the pointer as mutable but does not
    // write through it).
    unsafe {
        driver_call!(cuStreamUpdateCaptureDependencies_v2(
            stream,
            nodes.as_ptr().cast_mut(),
            std::ptr::null(),
            nodes.len(),
            flags,
        ))
    }
}

/// `cuGraphInstantiateWithFlags` (no flags): an executable graph of `graph`.
pub(crate) fn graph_instantiate(graph: CUgraph) -> Result<CUgraphExec> {
    let mut exec = std::ptr::null_mut();
    // SAFETY: a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphInstantiateWithFlags(&mut exec, graph, 0)) }?;
    Ok(exec)
}

/// `cuGraphUpload`: prepares `exec` for launches on `stream` (a first launch does it otherwise).
pub(crate) fn graph_upload(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    // SAFETY: a live executable graph and stream.
    unsafe { driver_call!(cuGraphUpload(exec, stream)) }
}

/// `cuGraphLaunch`: queues a run of `exec` on `stream`, after the stream's earlier work and the graph's earlier
/// launches, whatever streams those were on (ARCHITECTURE.md, "Graphs").
///
/// # Safety
/// Every memory address the graph's nodes use must stay allocated until the launch has completed.
pub(crate) unsafe fn graph_launch(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    // SAFETY: live handles; the memory as the caller guarantees.
    unsafe { driver_call!(cuGraphLaunch(exec, stream)) }
}

/// `cuGraphGetNodes`: the nodes of `graph`.
pub(crate) fn graph_nodes(graph: CUgraph) -> Result<Vec<CUgraphNode>> {
    let mut count = 0;
    // SAFETY: a live graph (see the module docs); a null array asks for the count.
    unsafe { driver_call!(cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)) }?;
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: room for `count` nodes.
    unsafe { driver_call!(cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) }?;
    nodes.truncate(count);
    Ok(nodes)
}

/// `cuGraphNodeGetType`.
pub(crate) fn graph_node_type(node: CUgraphNode) -> Result<CUgraphNodeType> {
    let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: a node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphNodeGetType(node, &mut kind)) }?;
    Ok(kind)
}

/// `cuGraphKernelNodeGetParams_v2`: a kernel node's launch. Its `kernelParams` point into the driver's copy of
/// the values, valid until the node's parameters are set.
pub(crate) fn kernel_node_params(node: CUgraphNode) -> Result<CUDA_KERNEL_NODE_PARAMS> {
    // SAFETY: all zeros is a valid CUDA_KERNEL_NODE_PARAMS (null handles and pointers), which the driver fills.
    let mut params: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphKernelNodeGetParams_v2(node, &mut params)) }?;
    Ok(params)
}

/// `cuGraphExecKernelNodeSetParams_v2` then `cuGraphKernelNodeSetParams_v2`: sets a kernel node's launch in
/// `exec` (for its launches from now on) and in its template graph. The driver copies the values.
///
/// # Safety
/// `params` must be a launch whose `kernelParams` hold one pointer per parameter of its function, each to a
/// value of that parameter's size, readable during the call; the memory the launches touch must stay
/// allocated and be ordered for them.
pub(crate) unsafe fn set_kernel_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe {
        driver_call!(cuGraphExecKernelNodeSetParams_v2(exec, node, params))?;
        driver_call!(cuGraphKernelNodeSetParams_v2(node, params))
    }
}

/// `cuGraphMemcpyNodeGetParams`: a copy node's copy.
pub(crate) fn memcpy_node_params(node: CUgraphNode) -> Result<CUDA_MEMCPY3D> {
    // SAFETY: all zeros is a valid CUDA_MEMCPY3D (null pointers, zero sizes), which the driver fills.
    let mut params: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    // SAFETY: a copy node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphMemcpyNodeGetParams(node, &mut params)) }?;
    Ok(params)
}

/// `cuGraphExecMemcpyNodeSetParams` (in `context`) then `cuGraphMemcpyNodeSetParams`: sets a copy node's copy
/// in `exec` (for its launches from now on) and in its template graph.
///
/// # Safety
/// The memory the copy touches must stay allocated and be ordered for the graph's launches.
pub(crate) unsafe fn set_memcpy_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_MEMCPY3D,
    context: CUcontext,
) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe {
        driver_call!(cuGraphExecMemcpyNodeSetParams(exec, node, params, context))?;
        driver_call!(cuGraphMemcpyNodeSetParams(node, params))
    }
}

/// `cuGraphMemsetNodeGetParams`: a memset node's memset.
pub(crate) fn memset_node_params(node: CUgraphNode) -> Result<CUDA_MEMSET_NODE_PARAMS> {
    let mut params = CUDA_MEMSET_NODE_PARAMS::default();
    // SAFETY: a memset node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphMemsetNodeGetParams(node, &mut params)) }?;
    Ok(params)
}

/// `cuGraphExecMemsetNodeSetParams` (in `context`) then `cuGraphMemsetNodeSetParams`: as
/// [`set_memcpy_node_params`], for a memset node.
///
/// # Safety
/// As [`set_memcpy_node_params`].
pub(crate) unsafe fn set_memset_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_MEMSET_NODE_PARAMS,
    context: CUcontext,
) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe {
        driver_call!(cuGraphExecMemsetNodeSetParams(exec, node, params, context))?;
        driver_call!(cuGraphMemsetNodeSetParams(node, params))
    }
}

/// `cuGraphExecDestroy`: the driver finishes launches still in flight, then frees it (returns at once).
///
/// # Safety
/// `exec` must be live and not used again.
pub(crate) unsafe fn graph_exec_destroy(exec: CUgraphExec) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { driver_call!(cuGraphExecDestroy(exec)) }
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` must be live and not used again.
pub(crate) unsafe fn graph_destroy(graph: CUgraph) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { driver_call!(cuGraphDestroy(graph)) }
}

/// `cuStreamIsCapturing`: whether `stream` is in a capture (active or invalidated).
pub(crate) fn stream_is_capturing(stream: CUstream) -> Result<bool> {
    let mut status = crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; an out-pointer to a local.
    unsafe { driver_call!(cuStreamIsCapturing(stream, &mut status)) }?;
    Ok(status != crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
