//! Stream capture and graphs: work queued on a capturing stream becomes nodes of a graph instead of running;
//! an instantiated graph launched on a stream runs its nodes, in a random order that keeps their
//! dependencies, as one operation of that stream. The rules are the driver's, as a probe of an H100 (driver
//! 580) showed them (the crate's ARCHITECTURE.md, "Graphs"):
//!
//! - A stream joins a capture by waiting for an event recorded in it; a capturing stream that waits for an
//!   event recorded outside the capture gets `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, and the capture is
//!   invalidated.
//! - Querying or synchronizing a capturing stream, and synchronizing its context, fail with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidate the capture, whatever its mode; so does querying
//!   an event recorded in it (`CUDA_ERROR_CAPTURED_EVENT`). Once the capture has ended, such an event is
//!   `CUDA_ERROR_INVALID_VALUE` to queries and waits until it is recorded again outside a capture.
//! - In the global mode (from any thread) and the thread-local mode (from the capturing thread), the calls
//!   that may synchronize (pinning and unpinning, `cuMemAlloc`, `cuMemFree`, stream and event queries and
//!   synchronizations) fail the same way; a free of any memory from a thread such a capture does not forbid
//!   succeeds and invalidates it. The relaxed mode forbids none of them. (Every thread is in the default mode
//!   here: `cuThreadExchangeStreamCaptureMode` is not modelled.)
//! - A free of memory allocated outside the capture, queued on a capturing stream, is
//!   `CUDA_ERROR_INVALID_VALUE` in the relaxed mode, and ends a capture of another mode. (Stream-ordered
//!   allocation inside a capture is not modelled: refused.)
//! - Launches of one executable graph run one after the other, whatever streams they are launched on; an
//!   executable graph destroyed while launched finishes those launches.
//! - Instantiating a graph needs a current context (`CUDA_ERROR_INVALID_CONTEXT` without one); asking whether
//!   a stream is capturing (`cuStreamIsCapturing`) never ends a capture, in any mode, from any thread.

#![allow(non_snake_case, reason = "the parameters keep cuda.h's names")]

use std::collections::HashSet;
use std::ffi::c_uint;
use std::sync::{Arc, MutexGuard};

use crate::api::{entry, live_stream, put};
use crate::sim::{Op, SIM, State};
use crate::sys::*;

type Outcome<T = ()> = Result<T, CUresult>;

/// A node of a graph: an operation and the nodes it runs after.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) handle: usize,
    pub(crate) op: Op,
    pub(crate) deps: Vec<usize>,
}

/// A capture in progress.
pub(crate) struct CaptureData {
    pub(crate) origin: usize,
    pub(crate) device: i32,
    pub(crate) mode: CUstreamCaptureMode,
    pub(crate) thread: std::thread::ThreadId,
    pub(crate) nodes: Vec<Node>,
    /// Every stream in the capture, the origin first.
    pub(crate) streams: Vec<usize>,
    pub(crate) invalidated: bool,
}

/// A capturing stream's place in its capture: the capture, and the nodes its next work depends on.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    pub(crate) capture: usize,
    pub(crate) deps: Vec<usize>,
    /// What `cuStreamGetCaptureInfo_v3` handed out last (node handles, which are `CUgraphNode`s), kept alive
    /// until the next call (as cuda.h allows).
    pub(crate) reported: Vec<usize>,
}

pub(crate) struct GraphData {
    pub(crate) device: i32,
    pub(crate) nodes: Arc<Vec<Node>>,
}

pub(crate) struct ExecData {
    pub(crate) device: i32,
    pub(crate) nodes: Arc<Vec<Node>>,
    /// Launches queued so far; each launch's ticket is the count before it.
    pub(crate) launched: u64,
    /// Launches finished: the launch of ticket `n` runs once `n` have.
    pub(crate) finished: u64,
    pub(crate) destroyed: bool,
}

/// One launch of an executable graph, as a stream's operation: its nodes as they were at the launch.
#[derive(Debug)]
pub(crate) struct GraphLaunch {
    pub(crate) exec: usize,
    pub(crate) ticket: u64,
    pub(crate) nodes: Arc<Vec<Node>>,
}

impl GraphLaunch {
    pub(crate) fn allocations(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.nodes.iter().flat_map(|n| n.op.allocations()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The nodes in a random order that keeps every dependency (seeded by the launch).
    pub(crate) fn order(&self) -> Vec<usize> {
        let mut seed = SIM.config.seed
            ^ (self.exec as u64).rotate_left(17)
            ^ self.ticket.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let index: std::collections::HashMap<usize, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.handle, i))
            .collect();
        let mut done = vec![false; self.nodes.len()];
        let mut order = Vec::with_capacity(self.nodes.len());
        while order.len() < self.nodes.len() {
            let ready: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| {
                    !done[i]
                        && self.nodes[i]
                            .deps
                            .iter()
                            .all(|d| index.get(d).is_none_or(|&j| done[j]))
                })
                .collect();
            let pick = ready[(next() % ready.len() as u64) as usize];
            done[pick] = true;
            order.push(pick);
        }
        order
    }
}

impl Link {
    /// Makes the stream's next work depend on `nodes` too.
    fn add(&mut self, nodes: Vec<usize>) {
        for node in nodes {
            if !self.deps.contains(&node) {
                self.deps.push(node);
            }
        }
    }
}

/// The capture of stream `handle`, which the caller found in one.
fn link_mut(state: &mut State, handle: usize) -> &mut Link {
    let stream = state.streams.get_mut(&handle).expect("a live stream");
    stream.capture.as_mut().expect("a stream in a capture")
}

/// The capture stream `handle` is in, if any.
pub(crate) fn link(state: &State, handle: usize) -> Option<&Link> {
    state.streams.get(&handle).and_then(|s| s.capture.as_ref())
}

/// Ends capture `id` as invalid: its streams stay in it until `cuStreamEndCapture`, and their work fails.
pub(crate) fn invalidate(state: &mut State, id: usize) {
    if let Some(capture) = state.captures.get_mut(&id) {
        capture.invalidated = true;
    }
}

/// Queues `op` in the capture stream `handle` is in: a node after the stream's dependencies, which it then
/// replaces. `sync` (an operation that would return only once done: a copy of pageable memory) is a
/// violation: the driver captures the copy, and every replay reads that memory whenever it runs.
pub(crate) fn add(state: &mut State, handle: usize, op: Op, sync: bool) -> Outcome {
    let link = link(state, handle).expect("the caller checked").clone();
    if state.captures[&link.capture].invalidated {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    if matches!(op, Op::Allocate { .. } | Op::Free { .. }) {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    if sync {
        let message = format!(
            "{} captured on stream {handle:#x} uses pageable host memory: every replay of the graph reads it \
             then, whether or not it is still there",
            op.describe()
        );
        state.violation(message);
    }
    let node = state.handle();
    let capture = state.captures.get_mut(&link.capture).expect("linked");
    capture.nodes.push(Node {
        handle: node,
        op,
        deps: link.deps,
    });
    let stream = state.streams.get_mut(&handle).expect("linked");
    stream.capture.as_mut().expect("linked").deps = vec![node];
    Ok(())
}

/// The calls that may synchronize (see the module docs): refused while a capture forbids them to this thread,
/// which invalidates that capture.
pub(crate) fn prohibited(state: &mut State) -> Outcome {
    let me = std::thread::current().id();
    refused_if(invalidate_where(state, |c| match c.mode {
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL => true,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL => c.thread == me,
        _ => false,
    }))
}

/// A free of memory, from any thread: invalidates every capture but relaxed ones (of `device`, or all for
/// host memory).
pub(crate) fn freed(state: &mut State, device: Option<i32>) {
    invalidate_where(state, |c| {
        c.mode != CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
            && device.is_none_or(|d| d == c.device)
    });
}

/// Invalidates every capture in progress that `which` picks; whether there was one.
fn invalidate_where(state: &mut State, mut which: impl FnMut(&CaptureData) -> bool) -> bool {
    let mut any = false;
    for capture in state.captures.values_mut().filter(|c| which(c)) {
        capture.invalidated = true;
        any = true;
    }
    any
}

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` where a call was `refused`.
fn refused_if(refused: bool) -> Outcome {
    if refused {
        Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

/// A query or synchronization of stream `handle`: refused if it is capturing, and the capture invalidated.
pub(crate) fn refuse_sync_of(state: &mut State, handle: usize) -> Outcome {
    if let Some(id) = link(state, handle).map(|l| l.capture) {
        invalidate(state, id);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// A synchronization of `device`'s context: refused while a capture of it is in progress, which it invalidates.
pub(crate) fn refuse_context_sync(state: &mut State, device: i32) -> Outcome {
    refused_if(invalidate_where(state, |c| c.device == device))
}

/// A query, synchronization or wait of an event recorded in a capture: invalidates the capture while it is in
/// progress (`CUDA_ERROR_CAPTURED_EVENT`), and is `CUDA_ERROR_INVALID_VALUE` after it.
pub(crate) fn refuse_captured_event(state: &mut State, event: usize) -> Outcome {
    let Some((id, _)) = state.events[&event].captured.clone() else {
        return Ok(());
    };
    if state.captures.contains_key(&id) {
        invalidate(state, id);
        Err(CUresult::CUDA_ERROR_CAPTURED_EVENT)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

/// `cuEventRecord` on a capturing stream: the event stands for the stream's dependencies in the capture.
pub(crate) fn record(state: &mut State, event: usize, handle: usize) -> Outcome {
    let link = link(state, handle).expect("the caller checked").clone();
    if state.captures[&link.capture].invalidated {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    state.events.get_mut(&event).expect("checked live").captured = Some((link.capture, link.deps));
    Ok(())
}

/// `cuStreamWaitEvent` where the event was recorded in a capture or the stream is capturing. `Ok(true)` where
/// the wait is done here (a stream joining or depending within a capture); `Ok(false)` for an ordinary wait.
pub(crate) fn wait(state: &mut State, handle: usize, event: usize) -> Outcome<bool> {
    let captured = state.events[&event].captured.clone();
    let mine = link(state, handle).map(|l| l.capture);
    match (captured, mine) {
        (None, None) => Ok(false),
        (None, Some(id)) => {
            invalidate(state, id);
            Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
        }
        (Some((id, _)), _) if !state.captures.contains_key(&id) => {
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
        (Some((id, deps)), None) => {
            // The stream joins the capture.
            let capture = state.captures.get_mut(&id).expect("checked");
            capture.streams.push(handle);
            state
                .streams
                .get_mut(&handle)
                .expect("checked live")
                .capture = Some(Link {
                capture: id,
                deps,
                reported: Vec::new(),
            });
            Ok(true)
        }
        (Some((id, deps)), Some(mine)) if id == mine => {
            let link = link_mut(state, handle);
            link.add(deps);
            Ok(true)
        }
        (Some((id, _)), Some(mine)) => {
            invalidate(state, id);
            invalidate(state, mine);
            Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
        }
    }
}

/// The nodes `deps` depend on, themselves included.
fn ancestry(nodes: &[Node], deps: &[usize]) -> HashSet<usize> {
    let by_handle: std::collections::HashMap<usize, &Node> =
        nodes.iter().map(|n| (n.handle, n)).collect();
    let mut seen = HashSet::new();
    let mut stack: Vec<usize> = deps.to_vec();
    while let Some(n) = stack.pop() {
        if seen.insert(n)
            && let Some(node) = by_handle.get(&n)
        {
            stack.extend(&node.deps);
        }
    }
    seen
}

fn live_exec(state: &State, exec: CUgraphExec) -> Outcome<usize> {
    let handle = exec as usize;
    match state.execs.get(&handle) {
        Some(e) if !e.destroyed => Ok(handle),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(
    hStream: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    entry("cuStreamBeginCapture_v2", |mut state| {
        let (handle, device) = live_stream(&state, hStream)?;
        if mode.0 > 2 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if link(&state, handle).is_some() {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        }
        let id = state.handle();
        state.captures.insert(
            id,
            CaptureData {
                origin: handle,
                device: device as i32,
                mode,
                thread: std::thread::current().id(),
                nodes: Vec::new(),
                streams: vec![handle],
                invalidated: false,
            },
        );
        state
            .streams
            .get_mut(&handle)
            .expect("checked live")
            .capture = Some(Link {
            capture: id,
            deps: Vec::new(),
            reported: Vec::new(),
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph) -> CUresult {
    entry("cuStreamEndCapture", |mut state| {
        if phGraph.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (handle, _) = live_stream(&state, hStream)?;
        let Some(id) = link(&state, handle).map(|l| l.capture) else {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        };
        if state.captures[&id].origin != handle {
            invalidate(&mut state, id);
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        let capture = state.captures.remove(&id).expect("linked");
        let origin_deps = link(&state, handle).expect("linked").deps.clone();
        let joined = ancestry(&capture.nodes, &origin_deps);
        let unjoined = capture
            .streams
            .iter()
            .any(|s| link(&state, *s).is_some_and(|l| l.deps.iter().any(|d| !joined.contains(d))));
        for s in &capture.streams {
            if let Some(stream) = state.streams.get_mut(s) {
                stream.capture = None;
            }
        }
        // SAFETY: checked non-null; cuda.h's contract: a writable CUgraph.
        unsafe { phGraph.write(std::ptr::null_mut()) };
        if capture.invalidated {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        if unjoined {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
        }
        let graph = state.handle();
        state.graphs.insert(
            graph,
            GraphData {
                device: capture.device,
                nodes: Arc::new(capture.nodes),
            },
        );
        put(phGraph, graph as CUgraph)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamIsCapturing(
    hStream: CUstream,
    captureStatus: *mut CUstreamCaptureStatus,
) -> CUresult {
    entry("cuStreamIsCapturing", |state| {
        let (handle, _) = live_stream(&state, hStream)?;
        let status = match link(&state, handle) {
            None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(l) if state.captures[&l.capture].invalidated => {
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
            }
            Some(_) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        };
        put(captureStatus, status)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetCaptureInfo_v3(
    hStream: CUstream,
    captureStatus_out: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    dependencies_out: *mut *const CUgraphNode,
    edgeData_out: *mut *const CUgraphEdgeData,
    numDependencies_out: *mut usize,
) -> CUresult {
    entry("cuStreamGetCaptureInfo_v3", |mut state| {
        let (handle, _) = live_stream(&state, hStream)?;
        let Some(link) = link(&state, handle).cloned() else {
            return put(
                captureStatus_out,
                CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            );
        };
        let status = if state.captures[&link.capture].invalidated {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
        } else {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        };
        put(captureStatus_out, status)?;
        if !id_out.is_null() {
            put(id_out, link.capture as cuuint64_t)?;
        }
        if !graph_out.is_null() {
            put(graph_out, link.capture as CUgraph)?;
        }
        if !edgeData_out.is_null() {
            put(edgeData_out, std::ptr::null())?;
        }
        let stream_link = link_mut(&mut state, handle);
        stream_link.reported = stream_link.deps.clone();
        if !dependencies_out.is_null() {
            put(
                dependencies_out,
                stream_link.reported.as_ptr().cast::<CUgraphNode>(),
            )?;
        }
        if !numDependencies_out.is_null() {
            put(numDependencies_out, stream_link.reported.len())?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    hStream: CUstream,
    dependencies: *mut CUgraphNode,
    dependencyData: *const CUgraphEdgeData,
    numDependencies: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuStreamUpdateCaptureDependencies_v2", |mut state| {
        let (handle, _) = live_stream(&state, hStream)?;
        if !dependencyData.is_null() || flags > 1 || (numDependencies > 0 && dependencies.is_null())
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let Some(id) = link(&state, handle).map(|l| l.capture) else {
            return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
        };
        let given: Vec<usize> = (0..numDependencies)
            // SAFETY: cuda.h's contract: `dependencies` holds `numDependencies` nodes (checked non-null).
            .map(|i| unsafe { dependencies.add(i).read() } as usize)
            .collect();
        let capture = &state.captures[&id];
        if given
            .iter()
            .any(|g| !capture.nodes.iter().any(|n| n.handle == *g))
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let link = link_mut(&mut state, handle);
        if flags == CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES.0 {
            link.deps.clear();
        }
        link.add(given);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphInstantiateWithFlags(
    phGraphExec: *mut CUgraphExec,
    hGraph: CUgraph,
    flags: cuuint64_t,
) -> CUresult {
    entry("cuGraphInstantiateWithFlags", |mut state| {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        // As the driver (an H200, driver 580): with no context current, CUDA_ERROR_INVALID_CONTEXT.
        crate::api::current(&state)?;
        let graph = state
            .graphs
            .get(&(hGraph as usize))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let data = ExecData {
            device: graph.device,
            nodes: Arc::new((*graph.nodes).clone()),
            launched: 0,
            finished: 0,
            destroyed: false,
        };
        let exec = state.handle();
        state.execs.insert(exec, data);
        put(phGraphExec, exec as CUgraphExec)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    entry("cuGraphUpload", |state| {
        live_exec(&state, hGraphExec)?;
        live_stream(&state, hStream)?;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream) -> CUresult {
    entry("cuGraphLaunch", |mut state| {
        let exec = live_exec(&state, hGraphExec)?;
        let (handle, device) = live_stream(&state, hStream)?;
        if state.execs[&exec].device != device as i32 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if link(&state, handle).is_some() {
            // A launch inside a capture would be a child graph: not modelled.
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let data = state.execs.get_mut(&exec).expect("checked live");
        let launch = GraphLaunch {
            exec,
            ticket: data.launched,
            nodes: Arc::clone(&data.nodes),
        };
        data.launched += 1;
        let state = crate::stream::submit(state, handle, Op::Graph(Arc::new(launch)), false);
        state.sticky(device as i32)?;
        Ok(())
    })
}

/// Runs a launch of an executable graph on `stream`'s worker: after the launches of it before, its nodes in an
/// order that keeps their dependencies.
pub(crate) fn run<'a>(
    mut state: MutexGuard<'a, State>,
    launch: &GraphLaunch,
    stream: usize,
) -> MutexGuard<'a, State> {
    state = SIM.wait_until(state, |s| {
        s.execs
            .get(&launch.exec)
            .is_none_or(|e| e.finished >= launch.ticket)
    });
    for i in launch.order() {
        state = crate::stream::execute(state, &launch.nodes[i].op, stream);
    }
    if let Some(exec) = state.execs.get_mut(&launch.exec) {
        exec.finished += 1;
        if exec.destroyed && exec.finished == exec.launched {
            state.execs.remove(&launch.exec);
        }
    }
    state
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(hGraphExec: CUgraphExec) -> CUresult {
    entry("cuGraphExecDestroy", |mut state| {
        let exec = live_exec(&state, hGraphExec)?;
        let data = state.execs.get_mut(&exec).expect("checked live");
        data.destroyed = true;
        if data.finished == data.launched {
            state.execs.remove(&exec);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(hGraph: CUgraph) -> CUresult {
    entry("cuGraphDestroy", |mut state| {
        let graph = state
            .graphs
            .remove(&(hGraph as usize))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        for node in graph.nodes.iter() {
            state.node_params.remove(&node.handle);
        }
        Ok(())
    })
}
