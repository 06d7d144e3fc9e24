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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::tracked::Track;
use crate::driver::{Stream, calls};
use crate::error::{Error, Result};
use crate::sys::CUgraphNode;
use crate::track::{Access, Timeline, Tracker};

/// The state of a capture in progress, which its streams carry (`Stream::capture`).
pub(crate) struct Recording {
    /// The capture's streams, the one that began it first: a stream's index here is its name in the trackers.
    streams: Vec<Stream>,
    uses: Mutex<HashMap<usize, Use>>,
}

/// A buffer the capture uses: held, and how (written if any captured work writes it).
struct Use {
    track: Track,
    access: Access,
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
            streams,
            uses: Mutex::new(HashMap::new()),
        }
    }

    fn uses(&self) -> MutexGuard<'_, HashMap<usize, Use>> {
        // Nothing panics under this lock but a bug; the map stays consistent whatever happened.
        self.uses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `enqueue`, which queues work on `stream` (a stream of the capture) that uses the buffers of `uses`,
    /// ordered in the capture after the conflicting captured work on the capture's other streams, and records
    /// it. The lock of the capture is not held while `enqueue` runs (it may be a user's, and call the crate).
    pub(crate) fn tracked<R>(
        &self,
        stream: &Stream,
        uses: &[(&Track, Access)],
        enqueue: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let index = self
            .streams
            .iter()
            .position(|s| s == stream)
            .expect("a stream carries the capture it is in");
        {
            let mut map = self.uses();
            for &(track, access) in uses {
                if track.is_host() && track.is_held() && !map.contains_key(&track.key()) {
                    // The graph that holds it lends it to the host; a second could launch meanwhile.
                    return Err(Error::invalid(
                        "another graph uses this host buffer: a host buffer belongs to one graph at a time \
                         (it lends the buffer to the host); use a copy of it; nothing was enqueued",
                    ));
                }
                let entry = map.entry(track.key()).or_insert_with(|| {
                    track.hold();
                    Use {
                        track: track.share(),
                        access,
                        tracker: Tracker::default(),
                    }
                });
                if access == Access::Write {
                    entry.access = Access::Write;
                }
                entry
                    .tracker
                    .prepare(&InCapture(&self.streams), &index, access)?;
            }
        }
        let enqueued = enqueue();
        // Recorded even if the enqueue failed, as in `Stream::tracked_as`.
        let nodes = calls::stream_capture_dependencies(stream.as_raw())
            .map_err(|e| e.context("reading where captured work stands in its graph"))?;
        let mark = Nodes(nodes.into());
        let mut map = self.uses();
        for &(track, access) in uses {
            if let Some(entry) = map.get_mut(&track.key()) {
                entry.tracker.record_use(&index, &mark, access);
            }
        }
        enqueued
    }

    /// The buffers the capture used, one per allocation with how it was used, in the order of their keys; each
    /// still held, now by the caller (who lets go of them, or whose graph keeps them).
    pub(crate) fn take_uses(&self) -> Vec<(Track, Access)> {
        let map = std::mem::take(&mut *self.uses());
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
