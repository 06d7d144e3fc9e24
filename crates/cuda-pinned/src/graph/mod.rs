//! CUDA graphs captured from the crate's streams, which own what they use (the crate's rule "A graph owns what it uses").
//!
//! [`Graph::capture`] runs a closure while the given streams are in a capture (`cuStreamBeginCapture_v2`,
//! relaxed mode): the crate's work queued on them from the calling thread (copies, its kernels, users'
//! kernels, declared foreign work) is recorded into a graph rather than run. The tracking records it apart
//! (`memory/captured.rs`): a crossing between the capture's streams becomes an edge of the graph, and every
//! buffer it uses is held by the capture, then by the executable graph, until the graph is dropped. A buffer
//! dropped meanwhile is released only then, after the graph's last launch; one kept is the user's to use
//! between launches, and each [`Graph::launch`] is tracked as one piece of work that reads and writes every
//! buffer the graph uses.
//!
//! What cannot be part of a capture is refused with an error before it reaches the driver, and the capture
//! goes on: a query or synchronization of a capturing stream, or of its context, would end it; an event
//! recorded in it stands for nothing outside it; a copy of pageable memory would be read at every replay;
//! an allocation would belong to the graph. The driver's rules behind this are in ARCHITECTURE.md ("Graphs").

#![allow(unsafe_code)]

mod nodes;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use bytemuck::Pod;

use crate::copy::{PinnedDestination, PinnedSource};
use crate::driver::{Capture, Context, Stream, calls};
use crate::error::{Error, Result};
use crate::memory::{Launched, Recording, Track, wait_lent};
use crate::sys::{CUevent, CUevent_flags, CUgraph, CUgraphExec};
use crate::track::Access;
use crate::{DeviceBuffer, Pinned, Registered};

/// An executable CUDA graph captured from the crate's streams, which keeps every buffer it uses alive until
/// it is dropped, and whose launches are tracked like any other work.
///
/// ```no_run
/// # fn main() -> cuda_pinned::Result<()> {
/// use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};
/// let context = Context::on(0)?;
/// let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
/// let input = Pinned::from_slice(&context, &[1.0f32; 1024])?;
/// let mut device = DeviceBuffer::<f32>::uninit(&a, 1024)?;
/// let mut output = Pinned::<f32>::zeroed(&context, 1024)?;
/// let mut step = Graph::capture(&[&a, &b], || {
///     a.upload(&input, &mut device)?; // recorded, not run
///     b.download(&device, &mut output)?; // after the upload: an edge of the graph
///     Ok(())
/// })?;
/// drop(input); // the graph keeps it until the graph is dropped
/// for _ in 0..10 {
///     step.launch(&a)?; // returns at once; tracked as one piece of work
/// }
/// assert!(output.as_slice()?.iter().all(|&x| x == 1.0)); // waits for the last launch
/// # Ok(()) }
/// ```
pub struct Graph {
    exec: CUgraphExec,
    graph: CUgraph,
    context: Context,
    /// Every buffer the graph's nodes use, one per allocation (written if any node writes it), in the order of
    /// their keys; each held until the graph is dropped.
    uses: Vec<(Track, Access)>,
    /// The keys of the buffers declared foreign work uses, in order: [`Graph::replace`] cannot see where
    /// such work keeps their addresses.
    declared: Vec<usize>,
    /// What each parameter of the kernels launched through `Stream::launch` is, by node (kept by
    /// [`Graph::replace`], which moves a pointer only to the buffer it replaces).
    kernels: nodes::Kernels,
    /// Where the last launch left the buffers (`Stream::tracked_launch`).
    last: Option<Launched>,
}

// SAFETY: the handles are the driver's, usable from any thread; launches take `&mut self`, so one thread at a
// time launches an executable graph.
unsafe impl Send for Graph {}
// SAFETY: `&Graph` reaches nothing but counts.
unsafe impl Sync for Graph {}

impl Graph {
    /// Records the work that `record` queues on `streams` into a graph and instantiates it. The first stream
    /// begins the capture (`cuStreamBeginCapture_v2`, relaxed mode) and the others join it at once; the crate's
    /// work queued on them from this thread while `record` runs (copies between pinned and device memory,
    /// memsets, the crate's kernels, [`Stream::launch`], [`Stream::enqueue_foreign`]) is recorded, not run.
    /// Work that crosses between them is ordered by edges of the graph where the buffers' tracking says, as it
    /// would be by events; nothing in the graph waits for work from outside it (each launch does, instead).
    ///
    /// The graph holds every buffer the recorded work uses, whoever owns it, until the graph is dropped: a
    /// buffer dropped before then is released after the graph's last launch, and a pooled one goes back to its
    /// pool only then.
    ///
    /// Refused while the streams capture, with an error that leaves the capture going: the crate's work on
    /// them from other threads, queries and synchronizations of them or of their context (they would end
    /// the capture), [`Event::record`](crate::Event::record) and [`Stream::wait`] on them, copies of pageable
    /// memory (staged or not), copies between devices, and allocating device memory on them. Other streams
    /// run their work as usual meanwhile.
    ///
    /// Blocks for the capture and the instantiation (`cuGraphInstantiateWithFlags`), which waits for no device
    /// work.
    ///
    /// # Errors
    /// An invalid-argument error for no stream, streams of several contexts, a stream given twice or one
    /// already capturing; `record`'s error; the driver's, from the capture (one invalidated by other code's
    /// call), its end or the instantiation. The streams are out of the capture again whatever happens, and
    /// the buffers held by a capture that made no graph are their owners' again. A panic in `record` ends the
    /// capture and goes on unwinding.
    #[doc(alias = "cuStreamBeginCapture")]
    #[doc(alias = "cuStreamEndCapture")]
    #[doc(alias = "cuGraphInstantiateWithFlags")]
    pub fn capture(streams: &[&Stream], record: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let Some(&origin) = streams.first() else {
            return Err(Error::invalid(
                "Graph::capture: no stream to capture; nothing was enqueued",
            ));
        };
        let context = origin.context().clone();
        for (i, stream) in streams.iter().enumerate() {
            if stream.context() != &context {
                return Err(Error::invalid(format_args!(
                    "Graph::capture: {stream:?} is of another context than {origin:?}: a graph belongs to one; \
                     nothing was enqueued"
                )));
            }
            if streams[..i].contains(stream) {
                return Err(Error::invalid(format_args!(
                    "Graph::capture: {stream:?} is given twice; nothing was enqueued"
                )));
            }
            stream.refuse_in_capture("Graph::capture")?;
        }
        let _current = context.enter()?;
        let recording = Arc::new(Recording::new(streams.iter().map(|&s| s.clone()).collect()));
        let mut session = Session::new(streams, &recording)?;
        let began = session.begin();
        let ran = match began {
            Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(record)),
            Err(e) => Ok(Err(e)),
        };
        let ended = session.end();
        // Captured work whose place in the graph was lost fails the capture. After a failure the buffers the
        // capture held are their owners' again, whether or not a stream stays marked (`Session::end`): the
        // recording refuses work from now on.
        let ended = match recording.close() {
            Ok(()) => ended,
            Err(e) => {
                destroy_graph(ended);
                Err(e)
            }
        };
        let let_go = || {
            for (track, _) in recording.take_uses() {
                track.let_go();
            }
        };
        let graph = match ran {
            Ok(Ok(())) => match ended {
                Ok(graph) => graph,
                Err(e) => {
                    let_go();
                    return Err(e);
                }
            },
            Ok(Err(e)) => {
                destroy_graph(ended);
                let_go();
                return Err(e);
            }
            Err(panic) => {
                destroy_graph(ended);
                let_go();
                std::panic::resume_unwind(panic);
            }
        };
        let exec = match calls::graph_instantiate(graph) {
            Ok(exec) => exec,
            Err(e) => {
                destroy_graph(Ok(graph));
                let_go();
                return Err(e.context("instantiating a captured graph"));
            }
        };
        let graph = Graph {
            exec,
            graph,
            context: context.clone(),
            declared: recording.declared_keys(),
            kernels: recording.take_kernels(),
            uses: recording.take_uses(),
            last: None,
        };
        // What the first launch would do otherwise: it then costs what every launch does. Untracked work of the
        // stream, using no buffer.
        origin
            .untracked(|| calls::graph_upload(exec, origin.as_raw()))
            .map_err(|e| e.context("uploading a captured graph"))?;
        Ok(graph)
    }

    /// Queues a run of the graph on `stream` (`cuGraphLaunch`), tracked as one piece of work that reads and
    /// writes every buffer the graph uses: `stream` first waits, on the device, for the work on other streams
    /// that conflicts with it, and later work on any stream, the host's accessors and the buffers' release
    /// wait for it. The driver runs the graph's launches one after another, whatever streams they are on.
    ///
    /// Returns at once.
    ///
    /// # Errors
    /// An invalid-argument error, with nothing enqueued, for a stream of another context or one in a capture,
    /// and while other code's work declared on one of the graph's buffers, in a way the launch conflicts with
    /// ([`Stream::enqueue_foreign`]), has not been recorded yet (its closure still runs, on any thread); the
    /// driver's.
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&mut self, stream: &Stream) -> Result<()> {
        if stream.context() != &self.context {
            return Err(Error::invalid(format_args!(
                "Graph::launch: {stream:?} is of another context than the graph; nothing was enqueued"
            )));
        }
        stream.refuse_in_capture("Graph::launch")?;
        let exec = self.exec;
        stream
            .tracked_launch(&self.uses, &mut self.last, || {
                // SAFETY: every buffer a node uses is held by this graph, so stays allocated until the launch,
                // recorded on each of them, has completed.
                unsafe { calls::graph_launch(exec, stream.as_raw()) }
            })
            .map_err(|e| e.context("launching a graph"))
    }

    /// The elements of `buffer`, host memory the graph uses, for reading on the host, once no launch of the graph
    /// (nor other work) writes them: the host's way to such a buffer, whose own accessors refuse while the graph
    /// lives (a launch borrows only the graph, so a slice they lent could be read while a launch writes it).
    /// The slice borrows the graph, which no launch can then take. Blocks until that work has completed.
    ///
    /// # Errors
    /// An invalid-argument error for a buffer the graph does not use; the driver's, from the wait.
    pub fn host_slice<'a, T: Pod>(&'a self, buffer: &'a impl PinnedSource<T>) -> Result<&'a [T]> {
        let track = self.held_host(buffer.track())?;
        wait_lent(track, Access::Read)?;
        // SAFETY: `buffer` holds `elements()` initialised `T`s at `host_ptr()`, page-locked and aligned; no
        // device work writes them now, and none can be queued while the borrows live: eager work that writes
        // them needs `buffer` by `&mut`, a launch of this graph needs the graph by `&mut`, and no other graph
        // uses host memory this one does (`Graph::capture` refuses it).
        Ok(unsafe { std::slice::from_raw_parts(buffer.host_ptr().cast::<T>(), buffer.elements()) })
    }

    /// The elements of `buffer`, host memory the graph uses, for writing on the host, once no launch of the graph
    /// (nor other work) reads or writes them. As [`Graph::host_slice`], exclusively.
    ///
    /// # Errors
    /// As [`Graph::host_slice`].
    pub fn host_slice_mut<'a, T: Pod>(
        &'a mut self,
        buffer: &'a mut impl PinnedDestination<T>,
    ) -> Result<&'a mut [T]> {
        let track = self.held_host(buffer.track())?;
        wait_lent(track, Access::Write)?;
        // SAFETY: as in `host_slice`, with no device work using the elements at all now, and both borrows
        // exclusive.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(buffer.host_ptr().cast::<T>(), buffer.elements())
        })
    }

    /// `track`, where it is one of the graph's buffers.
    fn held_host<'t>(&self, track: &'t Track) -> Result<&'t Track> {
        match self
            .uses
            .binary_search_by_key(&track.key(), |(t, _)| t.key())
        {
            Ok(_) => Ok(track),
            Err(_) => Err(Error::invalid(
                "Graph::host_slice: the graph does not use this buffer (its own accessors lend it); nothing was \
                 enqueued",
            )),
        }
    }

    /// Makes the graph's launches from now on use `new` wherever they used `old`, a buffer of the same kind and
    /// length: copies from and to it, memsets of it and kernel parameters holding its address move to the same
    /// offset in `new`. Launches queued before keep using `old`, which the graph lets go of: its owner's to use
    /// and drop again, after them. `new` is held by the graph from now on, as a buffer of the capture is (its
    /// host accessors refuse; [`Graph::host_slice`] lends it), and is used as `old` was; it is borrowed
    /// exclusively here, so that no slice of it lent before is still read when a launch writes it. The way to
    /// launch one graph on changing inputs and outputs (double buffering), instead of capturing one graph per
    /// buffer.
    ///
    /// Every node of the graph is read first (`cuGraphGetNodes`). Of a kernel launched with
    /// [`Stream::launch`], a parameter given as memory ([`Arg::read`](crate::Arg::read), ...) moves where it is
    /// `old`, and one given as a value of 8 bytes moves where it lies inside `old` or just past its end (an end
    /// pointer; the contract of [`Stream::launch`] leaves a value no other buffer to stand for). Host memory
    /// moves at its host address and at the device address it is mapped at, where that differs; a host `new`
    /// may be of another device's context (page-locked memory serves every context's copies). Nothing
    /// changes where the crate cannot move every use of `old`: a kernel parameter wider than 8 bytes (a struct)
    /// that holds an address inside it; foreign work declared in the capture that uses it (its nodes may keep
    /// the address where the crate cannot see); in a kernel the crate did not launch, a parameter of 8 bytes
    /// holding the address just past its end (an end pointer, or the start of what lies next: the crate
    /// cannot tell which); a node of a kind the crate cannot read (a host function, a child graph). Blocks for
    /// no device work: the nodes of the executable graph are changed in place (`cuGraphExec*NodeSetParams`).
    /// The sizes of a kernel node's parameters are asked of the driver as
    /// [`Module::kernel`](crate::Module::kernel) asks them: one failed call per function of the graph, which
    /// compute-sanitizer reports as an API error.
    ///
    /// # Errors
    /// An invalid-argument error, with nothing changed, for an `old` the graph does not use, a `new` it uses
    /// already, buffers of different lengths, a device buffer of another context, a host buffer another graph
    /// holds, or a use of `old` the crate cannot move (above); the driver's, from reading or changing the
    /// nodes: the changes made are then undone, or, where the driver refuses that too, the graph holds both
    /// buffers from then on (the error says so).
    #[doc(alias = "cuGraphExecKernelNodeSetParams")]
    #[doc(alias = "cuGraphExecMemcpyNodeSetParams")]
    pub fn replace<B: GraphBuffer>(&mut self, old: &B, new: &mut B) -> Result<()> {
        let (old, new) = (old.whole(), (*new).whole());
        let find = |track: &Track| {
            self.uses
                .binary_search_by_key(&track.key(), |(t, _)| t.key())
        };
        let Ok(at) = find(old.track) else {
            return Err(Error::invalid(
                "Graph::replace: the graph does not use the buffer to replace; nothing was changed",
            ));
        };
        if find(new.track).is_ok() {
            return Err(Error::invalid(
                "Graph::replace: the graph uses the new buffer already; nothing was changed",
            ));
        }
        if old.bytes != new.bytes {
            return Err(Error::invalid(format_args!(
                "Graph::replace: the buffer to replace holds {} bytes and the new one {}: a replacement has the \
                 same length; nothing was changed",
                old.bytes, new.bytes
            )));
        }
        if let Some(context) = new.device_context
            && context != &self.context
        {
            return Err(Error::invalid(
                "Graph::replace: the new buffer is device memory of another context than the graph; nothing \
                 was changed",
            ));
        }
        if self.declared.binary_search(&old.track.key()).is_ok() {
            return Err(Error::invalid(
                "Graph::replace: foreign work declared in the capture uses the buffer to replace, and the crate \
                 cannot see where its nodes keep the address; capture the graph again; nothing was changed",
            ));
        }
        let _current = self.context.enter()?;
        let mut ranges = vec![(old.address, new.address)];
        if old.device_context.is_none() {
            // A kernel reaches host memory at the device address it is mapped at (`Arg::read_host`), which
            // differs from the host address where the device cannot use that (registered memory on some
            // devices). Where the driver has no such address for one of them, no kernel was given it.
            let mapped =
                |address| calls::mem_host_get_device_pointer(address as *mut std::ffi::c_void);
            if let (Ok(from), Ok(to)) = (mapped(old.address), mapped(new.address))
                && from != old.address
            {
                ranges.push((from, to));
            }
        }
        let shift = nodes::Shift {
            ranges,
            bytes: old.bytes as u64,
        };
        let mut moved = nodes::Move::plan(self.graph, &shift, &self.kernels, old.track.key())
            .map_err(|e| e.context("reading the nodes of a graph"))?;
        if moved.is_empty() {
            return Err(Error::invalid(
                "Graph::replace: no node of the graph holds an address inside the buffer to replace where the \
                 crate can see it; nothing was changed",
            ));
        }
        if !new.track.hold() {
            return Err(Error::invalid(
                "Graph::replace: another graph holds the new buffer: a host buffer belongs to one graph at a \
                 time (it lends the buffer to the host); nothing was changed",
            ));
        }
        let access = self.uses[at].1;
        let insert = |uses: &mut Vec<(Track, Access)>| {
            let to = uses.partition_point(|(t, _)| t.key() < new.track.key());
            uses.insert(to, (new.track.share(), access));
        };
        // The next launch is tracked in full, on the buffers as they are now.
        self.last = None;
        match moved.apply(self.exec, self.context.as_raw()) {
            Ok(()) => {
                let (old_track, _) = self.uses.remove(at);
                insert(&mut self.uses);
                // The kernels' pointers to it are pointers to `new` now (and its key may name another buffer
                // once it is released).
                let (from, to) = (old_track.key(), new.track.key());
                for kinds in self.kernels.values_mut() {
                    for kind in kinds.iter_mut().filter(|k| **k == Some(from)) {
                        *kind = Some(to);
                    }
                }
                // Its release, if its owner has gone, waits for the launches recorded on it.
                old_track.let_go();
                Ok(())
            }
            Err(failed) if failed.undone => {
                new.track.let_go();
                Err(failed.error)
            }
            Err(failed) => {
                insert(&mut self.uses);
                // Some kernels' pointers moved and some did not: what the crate knew of those kernels is not
                // sure any more, and a later replace reads them as it reads kernels it did not launch.
                let keys = [old.track.key(), new.track.key()];
                self.kernels
                    .retain(|_, kinds| !kinds.iter().any(|k| k.is_some_and(|k| keys.contains(&k))));
                Err(failed.error)
            }
        }
    }

    /// The driver's handle of the executable graph, for interop. A launch through it is not tracked: order it
    /// yourself, and keep the graph alive until it has completed.
    #[must_use]
    pub fn as_raw(&self) -> CUgraphExec {
        self.exec
    }

    /// How many buffers (allocations) the graph uses and holds.
    #[must_use]
    pub fn buffers(&self) -> usize {
        self.uses.len()
    }

    /// The context the graph belongs to.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // The driver finishes launches in flight, then frees the graph: nothing waits here (ARCHITECTURE.md,
        // "Graphs").
        let destroyed = self.context.enter().and_then(|_current| {
            // SAFETY: instantiated in `capture`, destroyed once, here.
            unsafe { calls::graph_exec_destroy(self.exec) }?;
            // SAFETY: as above.
            unsafe { calls::graph_destroy(self.graph) }
        });
        if let Err(e) = destroyed {
            self.context.defer_error(e.context("destroying a graph"));
        }
        // The buffers dropped meanwhile go now, each after the launches recorded on it.
        for (track, _) in self.uses.drain(..) {
            track.let_go();
        }
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("exec", &self.exec)
            .field("buffers", &self.uses.len())
            .finish()
    }
}

/// Ends the capture `origin` began: its graph. Where the call fails and the stream is still in the capture, it is
/// tried once more, so that the capture ends whatever happened.
fn end_capture(origin: &Stream) -> Result<CUgraph> {
    let ended =
        calls::stream_end_capture(origin.as_raw()).map_err(|e| e.context("ending a capture"));
    if ended.is_ok() {
        return ended;
    }
    // Until the driver says the stream is out of a capture (a failed question counts as "still in one"), a
    // few times more.
    for _ in 0..3 {
        if matches!(calls::stream_is_capturing(origin.as_raw()), Ok(false)) {
            break;
        }
        destroy_graph(calls::stream_end_capture(origin.as_raw()));
    }
    ended
}

/// Destroys the graph of a capture whose recording failed, if it made one.
fn destroy_graph(ended: Result<CUgraph>) {
    if let Ok(graph) = ended {
        // SAFETY: made by the capture, used by nothing else. A failure leaks it.
        let _ = unsafe { calls::graph_destroy(graph) };
    }
}

/// A capture in progress over some streams: begun, then ended whatever happens, with every stream marked as
/// capturing for exactly as long as the driver may take it for one.
struct Session<'a> {
    streams: &'a [&'a Stream],
    capture: Capture,
    /// The event the other streams join and leave the capture through (recorded only in it).
    event: CUevent,
    /// The streams marked as capturing so far, from the first.
    marked: usize,
    /// Whether the first stream's capture began.
    began: bool,
}

impl<'a> Session<'a> {
    fn new(streams: &'a [&'a Stream], recording: &Arc<Recording>) -> Result<Session<'a>> {
        let event = calls::event_create(CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
            .map_err(|e| e.context("creating an event for a capture"))?;
        let state: Arc<dyn Any + Send + Sync> = recording.clone();
        Ok(Session {
            streams,
            capture: Capture {
                thread: crate::sync::primitives::this_thread(),
                state,
            },
            event,
            marked: 0,
            began: false,
        })
    }

    /// Marks each stream and brings it into the capture: the first begins it, the others wait for an event
    /// recorded in it. Each stream's open segment of tracked work is closed first (its event recorded outside
    /// the capture), under its segment lock, which the tracking's own work takes too: nothing of it lands
    /// between.
    fn begin(&mut self) -> Result<()> {
        let origin = self.streams[0];
        for (i, &stream) in self.streams.iter().enumerate() {
            let segment = stream.segment();
            // Checked again under the lock: another thread's capture may have begun since.
            stream.refuse_in_capture("Graph::capture")?;
            if segment.in_section() {
                // That section's untracked work would land in the graph instead of running.
                return Err(Error::invalid(format_args!(
                    "Graph::capture: {stream:?} is inside a Stream::profile or Stream::wait call (on this thread \
                     or another), whose work would join the graph; capture once it has returned; nothing was \
                     enqueued"
                )));
            }
            stream.close_segment()?;
            stream.set_capture(Some(self.capture.clone()));
            self.marked = i + 1;
            if i == 0 {
                calls::stream_begin_capture(stream.as_raw())
                    .map_err(|e| e.context("beginning a capture"))?;
                self.began = true;
                calls::event_record(self.event, origin.as_raw())
                    .map_err(|e| e.context("recording where the other streams join the capture"))?;
            } else {
                calls::stream_wait_event(stream.as_raw(), self.event)
                    .map_err(|e| e.context("joining a stream to the capture"))?;
            }
        }
        Ok(())
    }

    /// Joins the other streams back to the first and ends the capture: its graph, or why there is none. Every
    /// stream is out of the capture afterwards.
    fn end(&mut self) -> Result<CUgraph> {
        let origin = self.streams[0];
        let mut joined = Ok(());
        if self.began {
            for stream in &self.streams[1..self.marked] {
                if joined.is_ok() {
                    joined = calls::event_record(self.event, stream.as_raw())
                        .and_then(|()| calls::stream_wait_event(origin.as_raw(), self.event))
                        .map_err(|e| e.context("joining a stream back to the capture's first"));
                }
            }
        }
        let began = std::mem::take(&mut self.began);
        let ended = if began {
            end_capture(origin)
        } else {
            Err(Error::invalid("the capture did not begin"))
        };
        // A stream the driver still takes for capturing after this capture's end failed stays marked: the
        // crate's work on it is refused rather than recorded into a capture nobody ends.
        let stuck = began
            && ended.is_err()
            && matches!(calls::stream_is_capturing(origin.as_raw()), Ok(true));
        if !stuck {
            for stream in &self.streams[..self.marked] {
                stream.set_capture(None);
            }
        }
        self.marked = 0;
        match (joined, ended) {
            (Ok(()), ended) => ended,
            (Err(e), ended) => {
                destroy_graph(ended);
                Err(e)
            }
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.began || self.marked > 0 {
            destroy_graph(self.end());
        }
        // SAFETY: created in `new`, recorded only in the capture, which has ended; used by nothing else.
        if let Err(e) = unsafe { calls::event_destroy(self.event) } {
            let context = self.streams[0].context();
            context.defer_error(e.context("destroying the event of a capture (leaked)"));
        }
    }
}

/// A whole buffer a graph's launches can be moved to with [`Graph::replace`]: [`DeviceBuffer`], [`Pinned`]
/// (a pool's blocks too) and [`Registered`]. Sealed.
pub trait GraphBuffer: sealed::Whole {}

impl<T> GraphBuffer for DeviceBuffer<T> {}
impl<T> GraphBuffer for Pinned<T> {}
impl<T: Pod> GraphBuffer for Registered<T> {}

mod sealed {
    use super::{Context, DeviceBuffer, Pinned, Pod, Registered, Track};

    /// What [`Graph::replace`](super::Graph::replace) needs to know of a buffer.
    pub struct Extent<'a> {
        pub(super) track: &'a Track,
        /// Its first byte's address, as the graph's nodes hold it (device or host).
        pub(super) address: u64,
        pub(super) bytes: usize,
        /// The context of device memory; `None` for host memory.
        pub(super) device_context: Option<&'a Context>,
    }

    pub trait Whole {
        fn whole(&self) -> Extent<'_>;
    }

    impl<T> Whole for DeviceBuffer<T> {
        fn whole(&self) -> Extent<'_> {
            Extent {
                track: self.track(),
                address: self.as_raw(),
                bytes: self.byte_len(),
                device_context: Some(self.context()),
            }
        }
    }

    impl<T> Whole for Pinned<T> {
        fn whole(&self) -> Extent<'_> {
            Extent {
                track: self.track(),
                address: self.host_ptr() as u64,
                bytes: self.len() * std::mem::size_of::<T>(),
                device_context: None,
            }
        }
    }

    impl<T: Pod> Whole for Registered<T> {
        fn whole(&self) -> Extent<'_> {
            Extent {
                track: self.track(),
                address: self.host_ptr() as u64,
                bytes: self.len() * std::mem::size_of::<T>(),
                device_context: None,
            }
        }
    }
}
