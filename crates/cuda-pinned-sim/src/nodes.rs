//! The nodes of captured graphs, read and changed: a template graph's nodes and their parameters
//! (`cuGraphGetNodes`, `cuGraphNodeGetType`, the kernel, copy and memset nodes' `Get`/`SetParams`), and an
//! executable graph's copy of them (`cuGraphExec*NodeSetParams`). As the driver does (the crate's
//! ARCHITECTURE.md, "Graphs"), a change to an executable graph applies to its launches from then on: a launch
//! queued before keeps the parameters it was queued with. Only one-dimensional copies and memsets are
//! modelled.

#![allow(non_snake_case, reason = "the parameters keep cuda.h's names")]

use std::ffi::c_void;
use std::sync::Arc;

use crate::api::{any_loc, device_loc, entry, host_loc, put};
use crate::kernel::Launch;
use crate::sim::{Loc, Op, State};
use crate::sys::*;

type Outcome<T = ()> = Result<T, CUresult>;

/// The template graph holding `node`, and its index there.
fn find(state: &State, node: CUgraphNode) -> Outcome<(usize, usize)> {
    let handle = node as usize;
    state
        .graphs
        .iter()
        .find_map(|(&graph, data)| {
            let index = data.nodes.iter().position(|n| n.handle == handle)?;
            Some((graph, index))
        })
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `node`'s operation in its template graph.
fn op(state: &State, node: CUgraphNode) -> Outcome<&Op> {
    let (graph, index) = find(state, node)?;
    Ok(&state.graphs[&graph].nodes[index].op)
}

/// Replaces the operation of `node` in its template graph with `op`, of the same type.
fn set(state: &mut State, node: CUgraphNode, op: Op) -> Outcome {
    let (graph, index) = find(state, node)?;
    let nodes = &mut state.graphs.get_mut(&graph).expect("found").nodes;
    if std::mem::discriminant(&nodes[index].op) != std::mem::discriminant(&op) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Arc::make_mut(nodes)[index].op = op;
    Ok(())
}

/// Replaces the operation of `node` in the executable graph `exec` with `op`, where `allowed` accepts the
/// change from the operation there. Launches queued before keep theirs (the nodes are shared with them, and
/// copied here).
fn set_in_exec(
    state: &mut State,
    exec: CUgraphExec,
    node: CUgraphNode,
    op: Op,
    allowed: impl FnOnce(&State, &Op, &Op, i32) -> bool,
) -> Outcome {
    let handle = exec as usize;
    let data = match state.execs.get(&handle) {
        Some(e) if !e.destroyed => e,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let index = data
        .nodes
        .iter()
        .position(|n| n.handle == node as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let old = &data.nodes[index].op;
    if std::mem::discriminant(old) != std::mem::discriminant(&op)
        || !allowed(state, old, &op, data.device)
    {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let data = state.execs.get_mut(&handle).expect("checked");
    Arc::make_mut(&mut data.nodes)[index].op = op;
    Ok(())
}

/// What memory a location is, for the rule that an update keeps it: device memory of a device, host memory
/// the driver knows (pinned or registered), or pageable memory.
fn class(state: &State, loc: Loc) -> (u8, i32) {
    match loc {
        Loc::Alloc { id, .. } => match state.allocations.get(&id) {
            Some(a) if a.kind.is_device() => (0, a.device),
            _ => (1, -1),
        },
        Loc::Pageable(_) => (2, -1),
    }
}

/// The address a location stands for (0 for an allocation freed since: the simulator keeps no more).
fn address(state: &State, loc: Loc) -> u64 {
    match loc {
        Loc::Alloc { id, offset } => state
            .allocations
            .get(&id)
            .map_or(0, |a| a.base + offset as u64),
        Loc::Pageable(p) => p as u64,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphGetNodes(
    hGraph: CUgraph,
    nodes: *mut CUgraphNode,
    numNodes: *mut usize,
) -> CUresult {
    entry("cuGraphGetNodes", |state| {
        let data = state
            .graphs
            .get(&(hGraph as usize))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if numNodes.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !nodes.is_null() {
            // SAFETY: checked non-null; cuda.h's contract: `numNodes` is readable, and `nodes` has room for as
            // many handles as it says.
            let room = unsafe { numNodes.read() };
            for i in 0..room {
                let handle = data.nodes.get(i).map_or(0, |n| n.handle);
                // SAFETY: as above, `i < room`.
                unsafe { nodes.add(i).write(handle as CUgraphNode) };
            }
        }
        put(numNodes, data.nodes.len())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphNodeGetType(hNode: CUgraphNode, r#type: *mut CUgraphNodeType) -> CUresult {
    entry("cuGraphNodeGetType", |state| {
        type T = CUgraphNodeType;
        let kind = match op(&state, hNode)? {
            Op::Kernel(_) => T::CU_GRAPH_NODE_TYPE_KERNEL,
            Op::Copy { .. } => T::CU_GRAPH_NODE_TYPE_MEMCPY,
            Op::Set { .. } => T::CU_GRAPH_NODE_TYPE_MEMSET,
            Op::Host(_) => T::CU_GRAPH_NODE_TYPE_HOST,
            Op::Record { .. } => T::CU_GRAPH_NODE_TYPE_EVENT_RECORD,
            Op::Wait { .. } => T::CU_GRAPH_NODE_TYPE_WAIT_EVENT,
            Op::Allocate { .. } => T::CU_GRAPH_NODE_TYPE_MEM_ALLOC,
            Op::Free { .. } => T::CU_GRAPH_NODE_TYPE_MEM_FREE,
            Op::Graph(_) => T::CU_GRAPH_NODE_TYPE_GRAPH,
        };
        put(r#type, kind)
    })
}

// ---- kernel nodes

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphKernelNodeGetParams_v2(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphKernelNodeGetParams_v2", |mut state| {
        let Op::Kernel(launch) = op(&state, hNode)? else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let launch = Arc::clone(launch);
        // The values live in the node's launch; the array of pointers to them, until the next call for the
        // node (the driver's: until its parameters change).
        let pointers: Vec<usize> = launch
            .kernel
            .offsets
            .iter()
            .map(|&o| launch.params.as_ptr() as usize + o)
            .collect();
        let array = state.node_params.entry(hNode as usize).or_default();
        *array = pointers;
        let params = CUDA_KERNEL_NODE_PARAMS {
            func: launch.function as CUfunction,
            gridDimX: launch.grid[0],
            gridDimY: launch.grid[1],
            gridDimZ: launch.grid[2],
            blockDimX: launch.block[0],
            blockDimY: launch.block[1],
            blockDimZ: launch.block[2],
            sharedMemBytes: launch.shared,
            kernelParams: array.as_mut_ptr().cast(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        put(nodeParams, params)
    })
}

/// The launch `params` describe, checked and copied (`CUDA_ERROR_INVALID_VALUE` for a null pointer).
fn launch_of(state: &State, params: *const CUDA_KERNEL_NODE_PARAMS) -> Outcome<Launch> {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-null; cuda.h's contract: readable parameters.
    let p = unsafe { params.read() };
    if !p.kern.is_null() {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    Launch::build(
        state,
        p.func,
        [p.gridDimX, p.gridDimY, p.gridDimZ],
        [p.blockDimX, p.blockDimY, p.blockDimZ],
        p.sharedMemBytes,
        p.kernelParams,
        p.extra,
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphKernelNodeSetParams_v2(
    hNode: CUgraphNode,
    nodeParams: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphKernelNodeSetParams_v2", |mut state| {
        let launch = launch_of(&state, nodeParams)?;
        state.node_params.remove(&(hNode as usize));
        set(&mut state, hNode, Op::Kernel(Arc::new(launch)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    hGraphExec: CUgraphExec,
    hNode: CUgraphNode,
    nodeParams: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphExecKernelNodeSetParams_v2", |mut state| {
        let launch = launch_of(&state, nodeParams)?;
        // As the driver: another function is taken, if it is of the graph's context.
        let device = launch.device;
        set_in_exec(
            &mut state,
            hGraphExec,
            hNode,
            Op::Kernel(Arc::new(launch)),
            |_, _, _, exec_device| device == exec_device,
        )
    })
}

// ---- copy nodes

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphMemcpyNodeGetParams(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_MEMCPY3D,
) -> CUresult {
    entry("cuGraphMemcpyNodeGetParams", |state| {
        let &Op::Copy { dst, src, bytes } = op(&state, hNode)? else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: all zeros is a valid CUDA_MEMCPY3D (null pointers, zero sizes).
        let mut p: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
        let device = |loc| class(&state, loc).0 == 0;
        (p.srcMemoryType, p.dstMemoryType) = (memory_type(device(src)), memory_type(device(dst)));
        if device(src) {
            p.srcDevice = address(&state, src);
        } else {
            p.srcHost = address(&state, src) as *const c_void;
        }
        if device(dst) {
            p.dstDevice = address(&state, dst);
        } else {
            p.dstHost = address(&state, dst) as *mut c_void;
        }
        (p.WidthInBytes, p.Height, p.Depth) = (bytes, 1, 1);
        put(nodeParams, p)
    })
}

fn memory_type(device: bool) -> CUmemorytype {
    if device {
        CUmemorytype::CU_MEMORYTYPE_DEVICE
    } else {
        CUmemorytype::CU_MEMORYTYPE_HOST
    }
}

/// The one-dimensional copy `params` describe (`CUDA_ERROR_NOT_SUPPORTED` for arrays and more dimensions).
fn copy_of(state: &mut State, params: *const CUDA_MEMCPY3D, what: &str) -> Outcome<Op> {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-null; cuda.h's contract: readable parameters.
    let p = unsafe { params.read() };
    let flat = [p.srcY, p.srcZ, p.srcLOD, p.dstY, p.dstZ, p.dstLOD] == [0; 6]
        && p.Height <= 1
        && p.Depth <= 1;
    if !flat {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let bytes = p.WidthInBytes;
    let loc = |state: &mut State, kind: CUmemorytype, host: u64, device: u64, x: usize| {
        let x = x as u64;
        match kind {
            CUmemorytype::CU_MEMORYTYPE_HOST => host_loc(state, (host + x) as *const c_void, bytes),
            CUmemorytype::CU_MEMORYTYPE_DEVICE => device_loc(state, device + x, bytes, what),
            CUmemorytype::CU_MEMORYTYPE_UNIFIED => any_loc(state, device + x, bytes, what),
            _ => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        }
    };
    let src = loc(
        state,
        p.srcMemoryType,
        p.srcHost as u64,
        p.srcDevice,
        p.srcXInBytes,
    )?;
    let dst = loc(
        state,
        p.dstMemoryType,
        p.dstHost as u64,
        p.dstDevice,
        p.dstXInBytes,
    )?;
    Ok(Op::Copy { dst, src, bytes })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphMemcpyNodeSetParams(
    hNode: CUgraphNode,
    nodeParams: *const CUDA_MEMCPY3D,
) -> CUresult {
    entry("cuGraphMemcpyNodeSetParams", |mut state| {
        let copy = copy_of(&mut state, nodeParams, "cuGraphMemcpyNodeSetParams")?;
        set(&mut state, hNode, copy)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecMemcpyNodeSetParams(
    hGraphExec: CUgraphExec,
    hNode: CUgraphNode,
    copyParams: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    entry("cuGraphExecMemcpyNodeSetParams", |mut state| {
        let copy = copy_of(&mut state, copyParams, "cuGraphExecMemcpyNodeSetParams")?;
        // As the driver: each end stays the kind of memory it was, of the same device.
        set_in_exec(&mut state, hGraphExec, hNode, copy, |state, old, new, _| {
            let ends = |op: &Op| match *op {
                Op::Copy { dst, src, .. } => [class(state, dst), class(state, src)],
                _ => unreachable!("a copy node"),
            };
            ends(old) == ends(new)
        })
    })
}

// ---- memset nodes

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphMemsetNodeGetParams(
    hNode: CUgraphNode,
    nodeParams: *mut CUDA_MEMSET_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphMemsetNodeGetParams", |state| {
        let &Op::Set {
            dst,
            value,
            size,
            count,
        } = op(&state, hNode)?
        else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let params = CUDA_MEMSET_NODE_PARAMS {
            dst: address(&state, dst),
            pitch: 0,
            value,
            elementSize: size as u32,
            width: count,
            height: 1,
        };
        put(nodeParams, params)
    })
}

/// The one-dimensional memset `params` describe.
fn memset_of(state: &mut State, params: *const CUDA_MEMSET_NODE_PARAMS, what: &str) -> Outcome<Op> {
    if params.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-null; cuda.h's contract: readable parameters.
    let p = unsafe { params.read() };
    if p.height > 1 {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let size = p.elementSize as usize;
    if ![1, 2, 4].contains(&size) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let dst = device_loc(state, p.dst, size * p.width, what)?;
    Ok(Op::Set {
        dst,
        value: p.value,
        size,
        count: p.width,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphMemsetNodeSetParams(
    hNode: CUgraphNode,
    nodeParams: *const CUDA_MEMSET_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphMemsetNodeSetParams", |mut state| {
        let memset = memset_of(&mut state, nodeParams, "cuGraphMemsetNodeSetParams")?;
        set(&mut state, hNode, memset)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecMemsetNodeSetParams(
    hGraphExec: CUgraphExec,
    hNode: CUgraphNode,
    memsetParams: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    entry("cuGraphExecMemsetNodeSetParams", |mut state| {
        let memset = memset_of(&mut state, memsetParams, "cuGraphExecMemsetNodeSetParams")?;
        set_in_exec(
            &mut state,
            hGraphExec,
            hNode,
            memset,
            |state, old, new, _| {
                let dst = |op: &Op| match *op {
                    Op::Set { dst, .. } => class(state, dst),
                    _ => unreachable!("a memset node"),
                };
                dst(old) == dst(new)
            },
        )
    })
}
