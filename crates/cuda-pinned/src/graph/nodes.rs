//! The nodes of a captured graph, read and rewritten so that its launches use one allocation in place of
//! another ([`Graph::replace`](super::Graph::replace)).
//!
//! A [`Move`] is found by reading every node of the template graph: a copy's source and destination, a memset's
//! destination, and a kernel's 8-byte parameters that hold an address inside the old allocation move to the
//! same offset in the new one. Anything else that could reach the old allocation refuses the move, before
//! any node is changed: an address inside it in a larger parameter (a struct the crate cannot take apart), a
//! kernel node launched through `extra`, and every node of a kind the crate cannot read (a host function, a
//! child graph, ...). Each change is made to the executable graph (for the launches from then on: one queued
//! before keeps its parameters) and to the template (where the next move reads them).

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;

use crate::driver::calls;
use crate::error::{Error, Result};
use crate::sys::{
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS, CUcontext, CUfunction,
    CUgraph, CUgraphExec, CUgraphNode, CUgraphNodeType,
};

/// Addresses inside the old allocation taken to the same offset in the new one: each `(from, to)` is one way
/// the nodes may hold them (the host address, and for host memory the device address it is mapped at where
/// that differs), `bytes` long.
#[derive(Clone, Debug)]
pub(super) struct Shift {
    pub(super) ranges: Vec<(u64, u64)>,
    pub(super) bytes: u64,
}

impl Shift {
    /// `address` moved, where it lies inside the old allocation.
    fn apply(&self, address: u64) -> Option<u64> {
        self.ranges
            .iter()
            .find(|&&(from, _)| address.wrapping_sub(from) < self.bytes)
            .map(|&(from, to)| address - from + to)
    }

    /// `address` moved, where it lies inside the old allocation or just past its end (an end pointer).
    fn apply_to_end(&self, address: u64) -> Option<u64> {
        self.ranges
            .iter()
            .find(|&&(from, _)| address.wrapping_sub(from) <= self.bytes)
            .map(|&(from, to)| address - from + to)
    }
}

/// What the crate knows of the kernel nodes it launched (`Stream::launch`): by node, what each parameter is
/// (the key of the buffer it points to, or `None` for a value).
pub(super) type Kernels = HashMap<usize, Vec<Option<usize>>>;

/// A node's parameters, as the driver takes them.
enum Params {
    /// The launch, and each parameter's bytes (the launch's `kernelParams` points into them when set).
    Kernel(CUDA_KERNEL_NODE_PARAMS, Vec<Vec<u8>>),
    Copy(CUDA_MEMCPY3D),
    Memset(CUDA_MEMSET_NODE_PARAMS),
}

/// The nodes of a graph to change, each with its parameters before and after.
pub(super) struct Move {
    changes: Vec<(CUgraphNode, Params, Params)>,
}

impl Move {
    /// Reads every node of `graph` and plans `shift` for each that uses the old allocation (whose key is
    /// `old`). An invalid-argument error, before anything is changed, for a use of it the crate cannot move.
    pub(super) fn plan(
        graph: CUgraph,
        shift: &Shift,
        kernels: &Kernels,
        old: usize,
    ) -> Result<Move> {
        let mut changes = Vec::new();
        // The parameters' sizes of each function met: asked once per function, not per node (the last ask is
        // a failed call: see `param_sizes`).
        let mut sizes = HashMap::new();
        for node in calls::graph_nodes(graph)? {
            let params = match calls::graph_node_type(node)? {
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => kernel_params(node, &mut sizes)?,
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => {
                    Params::Copy(calls::memcpy_node_params(node)?)
                }
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => {
                    Params::Memset(calls::memset_node_params(node)?)
                }
                // Nodes that reach no memory.
                CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY
                | CUgraphNodeType::CU_GRAPH_NODE_TYPE_EVENT_RECORD
                | CUgraphNodeType::CU_GRAPH_NODE_TYPE_WAIT_EVENT => continue,
                other => {
                    return Err(Error::invalid(format_args!(
                        "Graph::replace: the graph has a node of a kind the crate cannot read ({other:?}): \
                         what it uses cannot be moved; nothing was changed"
                    )));
                }
            };
            let known = kernels.get(&(node as usize)).map(|k| (&k[..], old));
            if let Some(new) = params.shifted(shift, known)? {
                changes.push((node, params, new));
            }
        }
        Ok(Move { changes })
    }

    /// Whether no node uses the old allocation.
    pub(super) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Makes the changes to `exec` and the template graph, in `context`. Where one fails, those made are
    /// undone: [`Failed::undone`] says whether the driver let them all be (the graph then uses the old
    /// allocation alone; else it may use both).
    pub(super) fn apply(
        &mut self,
        exec: CUgraphExec,
        context: CUcontext,
    ) -> std::result::Result<(), Failed> {
        for i in 0..self.changes.len() {
            let (node, _, new) = &mut self.changes[i];
            if let Err(error) = new.set(exec, *node, context) {
                // The failed node too: its executable graph's part may have been set.
                let undone = self.changes[..=i]
                    .iter_mut()
                    .rev()
                    .try_for_each(|(node, old, _)| old.set(exec, *node, context));
                return Err(match undone {
                    Ok(()) => Failed {
                        error,
                        undone: true,
                    },
                    Err(again) => Failed {
                        error: error.context(format_args!(
                            "then undoing the nodes changed before failed too ({again}); the graph holds both \
                             buffers from now on"
                        )),
                        undone: false,
                    },
                });
            }
        }
        Ok(())
    }
}

/// A [`Move`] that failed.
pub(super) struct Failed {
    pub(super) error: Error,
    /// Whether every node was set back as it was.
    pub(super) undone: bool,
}

/// A kernel node's launch and the bytes of each of its parameters, whose sizes `known` keeps by function.
fn kernel_params(
    node: CUgraphNode,
    known: &mut HashMap<CUfunction, Option<Vec<usize>>>,
) -> Result<Params> {
    let mut p = calls::kernel_node_params(node)?;
    let sizes = match known.entry(p.func) {
        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::hash_map::Entry::Vacant(entry) => {
            entry.insert(crate::launch::param_sizes(p.func, None)?)
        }
    };
    let Some(sizes) = sizes else {
        return Err(Error::invalid(
            "Graph::replace: the driver cannot tell the sizes of a kernel node's parameters \
             (cuFuncGetParamInfo is CUDA 12.4+); nothing was changed",
        ));
    };
    if !p.extra.is_null() || p.kernelParams.is_null() && !sizes.is_empty() {
        return Err(Error::invalid(
            "Graph::replace: a kernel node of the graph takes its parameters through `extra`, which the crate \
             cannot read; nothing was changed",
        ));
    }
    let values = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            // SAFETY: the driver's array holds one pointer per parameter, each to `size` bytes, valid until
            // the node's parameters are set (not before this returns).
            unsafe {
                let value = p.kernelParams.add(i).read().cast::<u8>();
                std::slice::from_raw_parts(value, size).to_vec()
            }
        })
        .collect();
    p.kernelParams = std::ptr::null_mut();
    Ok(Params::Kernel(p, values))
}

impl Params {
    /// These parameters with `shift` made, or `None` where they do not use the old allocation; an
    /// invalid-argument error for a use of it that cannot be moved. `known`: for a kernel the crate launched,
    /// what each parameter is, and the old allocation's key.
    ///
    /// A parameter that points to a buffer moves where that buffer is the old one. A value moves where it lies
    /// inside the old allocation or just past its end (an end pointer: a value cannot stand for another
    /// buffer, which the launch would have been given as memory). Of a kernel the crate did not launch, a
    /// parameter of 8 bytes moves where it lies inside, and one just past the end is refused: it may be an end
    /// pointer or the start of the memory after it.
    fn shifted(
        &self,
        shift: &Shift,
        known: Option<(&[Option<usize>], usize)>,
    ) -> Result<Option<Params>> {
        Ok(match self {
            Params::Kernel(p, values) => {
                let mut moved = false;
                let mut new = values.clone();
                let known = known.filter(|(kinds, _)| kinds.len() == values.len());
                for (i, value) in new.iter_mut().enumerate() {
                    if let Ok(bytes) = <[u8; 8]>::try_from(value.as_slice()) {
                        let address = u64::from_ne_bytes(bytes);
                        let to = match known {
                            Some((kinds, old)) => match kinds[i] {
                                Some(buffer) if buffer != old => None,
                                _ => shift.apply_to_end(address),
                            },
                            None => shift.apply(address),
                        };
                        if let Some(to) = to {
                            value.copy_from_slice(&to.to_ne_bytes());
                            moved = true;
                        } else if known.is_none() && shift.apply_to_end(address).is_some() {
                            // Moved, an end pointer stays right; not moved, it would end past the new buffer.
                            return Err(Error::invalid(format_args!(
                                "Graph::replace: parameter {i} of a kernel node holds the address just past the \
                                 end of the buffer to replace, which may be its end or the start of the memory \
                                 after it: the crate cannot tell which; nothing was changed"
                            )));
                        }
                    } else if value.windows(8).any(|w| {
                        shift
                            .apply(u64::from_ne_bytes(w.try_into().expect("8 bytes")))
                            .is_some()
                    }) {
                        return Err(Error::invalid(format_args!(
                            "Graph::replace: parameter {i} of a kernel node ({} bytes) holds an address inside \
                             the buffer replaced, which the crate cannot move (only a parameter of 8 bytes is \
                             taken for an address); nothing was changed",
                            value.len()
                        )));
                    }
                }
                moved.then_some(Params::Kernel(*p, new))
            }
            Params::Copy(p) => {
                let mut new = *p;
                let mut moved = false;
                for address in [&mut new.srcDevice, &mut new.dstDevice] {
                    if let Some(to) = shift.apply(*address) {
                        (*address, moved) = (to, true);
                    }
                }
                // Host memory is at its host address (unified addressing): the same shift.
                if let Some(to) = shift.apply(new.srcHost as u64) {
                    (new.srcHost, moved) = (to as *const c_void, true);
                }
                if let Some(to) = shift.apply(new.dstHost as u64) {
                    (new.dstHost, moved) = (to as *mut c_void, true);
                }
                moved.then_some(Params::Copy(new))
            }
            Params::Memset(p) => shift.apply(p.dst).map(|dst| {
                let mut new = *p;
                new.dst = dst;
                Params::Memset(new)
            }),
        })
    }

    /// Sets these parameters on `node`, in `exec` and in its template graph.
    fn set(&mut self, exec: CUgraphExec, node: CUgraphNode, context: CUcontext) -> Result<()> {
        match self {
            Params::Kernel(p, values) => {
                let mut pointers: Vec<*mut c_void> =
                    values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
                let mut p = *p;
                if !pointers.is_empty() {
                    p.kernelParams = pointers.as_mut_ptr();
                }
                // SAFETY: the node's own launch, with addresses moved to memory of the same size, kind and
                // context, which the graph holds; one pointer per parameter, to its bytes.
                unsafe { calls::set_kernel_node_params(exec, node, &p) }
            }
            // SAFETY: as above.
            Params::Copy(p) => unsafe { calls::set_memcpy_node_params(exec, node, p, context) },
            // SAFETY: as above.
            Params::Memset(p) => unsafe { calls::set_memset_node_params(exec, node, p, context) },
        }
        .map_err(|e| e.context("changing a node of a graph"))
    }
}
