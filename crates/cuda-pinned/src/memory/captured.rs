//! Tracked work queued while its stream is in a capture (see `graph.rs`): recorded into the graph instead of
//! run, so it is tracked apart from the work that runs.
//!
//! A buffer's own tracker is not touched: captured work runs only when the graph is launched, and each
//! launch is tracked then, as one piece of work that reads and writes every buffer the graph uses. Nor may
//! captured work wait for work outside the capture (the driver refuses it, `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`,
//! and ends the capture). So each buffer used in a capture gets a tracker of its own for the capture, whose
//! marks are the capture's nodes (what `cuStreamGetCaptureInfo_v3` says the stream's next work depends on,
//! right after the work), and whose waits make a stream's next work depend on such nodes
//! (`cuStreamUpdateCaptureDependencies_v2`): a crossing between the capture's streams becomes an edge of the
//! graph, with no event. The capture also holds every buffer it uses (`Track::hold`), which the graph takes
//! over: a buffer dropped meanwhile is released only when the graph is.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::tracked::Track;
use crate::driver::{Stream, calls};
use crate::error::{Error, Result};
use crate::sys::CUgraphNode;
use crate::track::{Access, Timeline, Tracker};

/// The state of a capture in progress, which its streams carry (`Stream::capture`).
pub(crate) struct Recording {
    state: Mutex<State>,
}

struct State {
    /// The capture's streams, the one that began it first: a stream's index here is its name in the trackers.
    /// Emptied when the capture ends ([`Recording::close`]), so that a stream still marked with it holds no
    /// cycle.
    streams: Vec<Stream>,
    uses: HashMap<usize, Use>,
    /// The kernel nodes launched through `Stream::launch`, with what each parameter is ([`How::Kernel`]).
    kernels: HashMap<usize, Vec<Option<usize>>>,
    /// Why the capture cannot make a graph: captured work whose place in it could not be read, so that no
    /// edge would order it.
    failed: Option<Error>,
}

/// Who queued captured work, and what the crate knows of it.
#[derive(Clone, Copy)]
pub(crate) enum How<'a> {
    /// The crate's own copies and kernels.
    Crate,
    /// Declared foreign work (`Stream::enqueue_foreign`): where it keeps its buffers' addresses is not the
    /// crate's to read.
    Declared,
    /// A kernel launched through `Stream::launch`, one node: for each parameter, the key of the buffer it
    /// points to (an `Arg` of memory), or `None` for a value passed by copy.
    Kernel(&'a [Option<usize>]),
}

/// A buffer the capture uses: held, and how (written if any captured work writes it).
struct Use {
    track: Track,
    access: Access,
    /// Whether work the crate did not queue itself (declared foreign work) uses it: where that work keeps its
    /// address is not the crate's to read.
    declared: bool,
    tracker: Tracker<usize, Nodes>,
}

/// A point in the capture: the nodes work queued on a stream right after some work depends on.
#[derive(Clone)]
struct Nodes(Arc<[CUgraphNode]>);

impl PartialEq for Nodes {
    fn eq(&self, other: &Nodes) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Nodes {}

// SAFETY: graph nodes are driver handles, passed only to driver calls on the capture's streams.
unsafe impl Send for Nodes {}
// SAFETY: as for Send: shared, they are only read.
unsafe impl Sync for Nodes {}

/// The capture as a buffer's tracker sees it: marks are nodes, and a wait is a dependency in the graph.
struct InCapture<'a>(&'a [Stream]);

impl Timeline for InCapture<'_> {
    type Stream = usize;
    type Mark = Nodes;
    type Error = Error;

    fn wait(&self, stream: &usize, _on: &usize, mark: &Nodes) -> Result<()> {
        calls::stream_add_capture_dependencies(self.0[*stream].as_raw(), &mark.0).map_err(|e| {
            e.context("making captured work depend on work of another stream of the capture")
        })
    }

    fn is_complete(&self, _on: &usize, _mark: &Nodes) -> Result<bool> {
        Err(Error::invalid(
            "a capture's work runs only when its graph is launched (a bug of the crate)",
        ))
    }

    fn synchronize(&self, _on: &usize, _mark: &Nodes) -> Result<()> {
        Err(Error::invalid(
            "a capture's work runs only when its graph is launched (a bug of the crate)",
        ))
    }
}

impl Recording {
    pub(crate) fn new(streams: Vec<Stream>) -> Recording {
        Recording {
            state: Mutex::new(State {
                streams,
                uses: HashMap::new(),
                kernels: HashMap::new(),
                failed: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics under this lock but a bug; the state stays consistent whatever happened.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `enqueue`, which queues work on `stream` (a stream of the capture) that uses the buffers of `uses`,
    /// ordered in the capture after the conflicting captured work on the capture's other streams, and records
    /// it. The lock of the capture is not held while `enqueue` runs (it may be a user's, and call the crate).
    /// `how` says who queued the work.
    ///
    /// # Errors
    /// An invalid-argument error for a host buffer another graph holds, or once the capture has ended or
    /// failed; the driver's. Where the work was queued but its place in the graph could not be read, the whole
    /// capture fails.
    pub(crate) fn tracked<R>(
        &self,
        stream: &Stream,
        uses: &[(&Track, Access)],
        how: How<'_>,
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let declared = matches!(how, How::Declared);
        let index = {
            let mut state = self.state();
            if let Some(e) = &state.failed {
                return Err(e.clone());
            }
            let Some(index) = state.streams.iter().position(|s| s == stream) else {
                return Err(Error::invalid(
                    "the capture this stream was in has ended; nothing was enqueued",
                ));
            };
            let State {
                streams, uses: map, ..
            } = &mut *state;
            for &(track, access) in uses {
                let entry = match map.entry(track.key()) {
                    std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                    std::collections::hash_map::Entry::Vacant(entry) => {
                        if !track.hold() {
                            // The graph that holds it lends it to the host; a second could launch meanwhile.
                            return Err(Error::invalid(
                                "another graph uses this host buffer: a host buffer belongs to one graph at a \
                                 time (it lends the buffer to the host); use a copy of it; nothing was enqueued",
                            ));
                        }
                        entry.insert(Use {
                            track: track.share(),
                            access,
                            declared,
                            tracker: Tracker::default(),
                        })
                    }
                };
                if access == Access::Write {
                    entry.access = Access::Write;
                }
                entry.declared |= declared;
                entry.tracker.prepare(&InCapture(streams), &index, access)?;
            }
            index
        };
        let enqueued = enqueue();
        // Recorded even if the enqueue failed, as in `Stream::tracked_as`.
        let nodes = calls::stream_capture_dependencies(stream.as_raw())
            .map_err(|e| e.context("reading where captured work stands in its graph"));
        let mut state = self.state();
        let nodes = match nodes {
            Ok(nodes) => nodes,
            Err(e) => {
                // The work may be in the graph with nothing to order it after: no graph from this capture.
                state.failed = Some(e.clone());
                return Err(e);
            }
        };
        if let (How::Kernel(params), [node]) = (how, nodes.as_slice()) {
            state.kernels.insert(*node as usize, params.to_vec());
        }
        let mark = Nodes(nodes.into());
        for &(track, access) in uses {
            if let Some(entry) = state.uses.get_mut(&track.key()) {
                entry.tracker.record_use(&index, &mark, access);
            }
        }
        enqueued
    }

    /// Ends the recording once its capture has: its streams are let go of, and its work refused from now on.
    ///
    /// # Errors
    /// Why the capture cannot make a graph, if it cannot.
    pub(crate) fn close(&self) -> Result<()> {
        let mut state = self.state();
        state.streams.clear();
        match &state.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The keys of the buffers the capture used through declared foreign work, in order.
    pub(crate) fn declared_keys(&self) -> Vec<usize> {
        let mut keys: Vec<usize> = (self.state().uses.iter())
            .filter(|(_, u)| u.declared)
            .map(|(&key, _)| key)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// The kernel nodes launched through `Stream::launch` (by node handle), with what each parameter is.
    pub(crate) fn take_kernels(&self) -> HashMap<usize, Vec<Option<usize>>> {
        std::mem::take(&mut self.state().kernels)
    }

    /// The buffers the capture used, one per allocation with how it was used, in the order of their keys; each
    /// still held, now by the caller (who lets go of them, or whose graph keeps them).
    pub(crate) fn take_uses(&self) -> Vec<(Track, Access)> {
        let map = std::mem::take(&mut self.state().uses);
        let mut uses: Vec<(Track, Access)> =
            map.into_values().map(|u| (u.track, u.access)).collect();
        uses.sort_unstable_by_key(|(track, _)| track.key());
        uses
    }

    /// The capture's state as its streams carry it (`Stream::capture`), if it is one.
    pub(crate) fn of(state: &Arc<dyn std::any::Any + Send + Sync>) -> Option<&Recording> {
        state.downcast_ref::<Recording>()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        // A capture that made no graph: the buffers it held are their owners' again.
        for (track, _) in self.take_uses() {
            track.let_go();
        }
    }
}
