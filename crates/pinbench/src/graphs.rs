//! `pinbench graphs`: a step of [`LAUNCHES`] small launches over [`BUFFERS`] buffers on two streams, captured
//! once and replayed through the crate's `Graph`, against the same step captured and replayed with raw driver
//! calls, and against the step issued eagerly through the crate.
//!
//! Launch `i` writes buffer `i % 64` (y) from another (x): buffer `i + 2` on the same stream, or, every
//! [`CROSS_EVERY`]th launch, buffer `i + 1`, which the other stream writes: a crossing. Buffers of even index
//! belong to the first stream, odd ones to the second. With feature `gpu` a launch is the crate's `axpy` kernel
//! (`y = x + y` over [`ELEMENTS`] floats); without it, a device-to-device copy, so the mode runs on the
//! simulated driver too. The raw step makes the same launches on raw handles, ordering each crossing with an
//! event recorded on the writer's stream at the crossing (which the crate's graph orders by an edge from the
//! writing node instead).
//!
//! Figures, each a median: capture plus instantiation; the wall time of a step replayed back to back
//! ([`REPLAYS`] launches, then a synchronization); the host time of one launch call (the stream idle before
//! it); and the wall time of an eager step. Every way's results are checked against the others'.

use std::time::Instant;

use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};
use serde::Serialize;

use crate::Outcome;
use crate::timing::median;

/// Launches in a step.
pub const LAUNCHES: usize = 1000;
/// Buffers the step uses.
pub const BUFFERS: usize = 64;
/// Floats in each buffer.
pub const ELEMENTS: usize = 256;
/// Every this many launches, one reads a buffer the other stream writes.
pub const CROSS_EVERY: usize = 16;
/// Replays back to back per wall-time figure.
pub const REPLAYS: usize = 100;

/// What `pinbench graphs` measured.
#[derive(Debug, Serialize)]
pub struct Figures {
    pub device: String,
    pub launches: usize,
    pub buffers: usize,
    pub crossings: usize,
    pub rounds: usize,
    pub raw: Side,
    #[serde(rename = "crate")]
    pub crate_: Side,
    /// The eager step through the crate: wall time, host time of issuing it.
    pub eager_wall_us: f64,
    pub eager_host_us: f64,
    /// crate / raw capture plus instantiation (goal <= 1.5).
    pub capture_ratio: f64,
    /// crate / raw replay wall time (goal <= 1.05).
    pub replay_ratio: f64,
    /// crate - raw host time of a launch in a loop, in us (goal <= 2).
    pub launch_extra_us: f64,
    /// The same, right after a synchronization.
    pub launch_after_sync_extra_us: f64,
    /// eager / crate replay wall time (goal >= 4).
    pub eager_over_replay: f64,
    pub verified: bool,
}

/// One way of capturing and replaying the step.
#[derive(Debug, Serialize)]
pub struct Side {
    /// Capture plus instantiation (and upload), in us.
    pub capture_us: f64,
    /// Wall time per step, replayed back to back, in us.
    pub replay_wall_us: f64,
    /// Host time of one launch call in a loop of launches, in us.
    pub launch_host_us: f64,
    /// Host time of one launch call right after the stream was synchronized (as after reading a step's
    /// result), in us.
    pub launch_after_sync_us: f64,
}

/// Launch `i`'s buffers and stream: (y, x, stream 0 or 1).
fn plan(i: usize) -> (usize, usize, usize) {
    let y = i % BUFFERS;
    let x = if i % CROSS_EVERY == CROSS_EVERY - 1 {
        (i + 1) % BUFFERS
    } else {
        (i + 2) % BUFFERS
    };
    (y, x, y % 2)
}

/// Whether launch `i`'s stream must first wait for the other stream: it reads a buffer the other stream wrote
/// (the crossings), or writes one the other stream read since it was last written. The raw step orders these
/// with events; the crate's tracking finds them itself.
fn waits() -> Vec<bool> {
    let mut read_by_other = [false; BUFFERS];
    (0..LAUNCHES)
        .map(|i| {
            let (y, x, s) = plan(i);
            let crossing = x % 2 != s;
            let after_reads = std::mem::take(&mut read_by_other[y]);
            if crossing {
                read_by_other[x] = true;
            }
            crossing || after_reads
        })
        .collect()
}

/// `x` and `y` of launch `i`, borrowed from `buffers` (`x != y`).
fn pair(
    buffers: &mut [DeviceBuffer<f32>],
    x: usize,
    y: usize,
) -> (&DeviceBuffer<f32>, &mut DeviceBuffer<f32>) {
    if x < y {
        let (low, high) = buffers.split_at_mut(y);
        (&low[x], &mut high[0])
    } else {
        let (low, high) = buffers.split_at_mut(x);
        (&high[0], &mut low[y])
    }
}

/// One launch through the crate, tracked.
fn launch(
    stream: &Stream,
    x: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
) -> cuda_pinned::Result<()> {
    #[cfg(feature = "gpu")]
    {
        cuda_pinned::kernels::axpy(stream, 1.0, x, y)
    }
    #[cfg(not(feature = "gpu"))]
    {
        stream.copy(x, y)
    }
}

/// The same launch on raw handles, untracked.
///
/// # Safety
/// `x` and `y` are [`ELEMENTS`] floats of live device memory of `stream`'s context.
unsafe fn launch_raw(
    stream: cuda_pinned::sys::CUstream,
    x: u64,
    y: u64,
) -> cuda_pinned::Result<()> {
    #[cfg(feature = "gpu")]
    {
        use cuda_pinned::kernels::raw;
        // SAFETY: as the caller guarantees.
        let code = unsafe {
            raw::cuda_pinned_axpy_f32(1.0, x as *const f32, y as *mut f32, ELEMENTS, stream)
        };
        raw::check_launch(code, "cuda_pinned_axpy_f32")
    }
    #[cfg(not(feature = "gpu"))]
    {
        // SAFETY: as the caller guarantees.
        unsafe { cuda_pinned::driver_call!(cuMemcpyDtoDAsync_v2(y, x, ELEMENTS * 4, stream)) }
    }
}

/// The eager step through the crate.
fn eager_step(streams: [&Stream; 2], buffers: &mut [DeviceBuffer<f32>]) -> cuda_pinned::Result<()> {
    for i in 0..LAUNCHES {
        let (y, x, s) = plan(i);
        let (x, y) = pair(buffers, x, y);
        launch(streams[s], x, y)?;
    }
    Ok(())
}

/// Two streams the crate does not know, for the raw side: a capture on a stream the crate knows, behind its
/// back, would be ended by the crate's release thread querying that stream (ARCHITECTURE.md, "Graphs").
struct RawStreams([cuda_pinned::sys::CUstream; 2]);

impl RawStreams {
    fn new() -> cuda_pinned::Result<RawStreams> {
        let mut raw = [std::ptr::null_mut(); 2];
        for stream in &mut raw {
            let flags = cuda_pinned::sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0;
            // SAFETY: an out-pointer; the thread's context is the device's; destroyed in Drop.
            unsafe { cuda_pinned::driver_call!(cuStreamCreate(stream, flags)) }?;
        }
        Ok(RawStreams(raw))
    }

    fn synchronize(&self) -> cuda_pinned::Result<()> {
        // SAFETY: a live stream.
        unsafe { cuda_pinned::driver_call!(cuStreamSynchronize(self.0[0])) }
    }
}

impl Drop for RawStreams {
    fn drop(&mut self) {
        for stream in self.0 {
            // SAFETY: made in `new`, destroyed once.
            let _ = unsafe { cuda_pinned::driver_call!(cuStreamDestroy_v2(stream)) };
        }
    }
}

/// A raw graph of the step, captured on raw streams with events (`events[0]` forks and joins, the others
/// order the crossings).
struct RawGraph {
    graph: cuda_pinned::sys::CUgraph,
    exec: cuda_pinned::sys::CUgraphExec,
}

impl RawGraph {
    fn capture(
        streams: &RawStreams,
        buffers: &[DeviceBuffer<f32>],
        events: &[cuda_pinned::sys::CUevent],
    ) -> cuda_pinned::Result<RawGraph> {
        use cuda_pinned::driver_call;
        use cuda_pinned::sys::CUstreamCaptureMode;
        let raw = streams.0;
        let (a, b) = (raw[0], raw[1]);
        let mut graph = std::ptr::null_mut();
        let mut exec = std::ptr::null_mut();
        // SAFETY: live streams and events of one context; the buffers live while the graph is launched (the
        // caller keeps them).
        unsafe {
            driver_call!(cuStreamBeginCapture_v2(
                a,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
            ))?;
            driver_call!(cuEventRecord(events[0], a))?;
            driver_call!(cuStreamWaitEvent(b, events[0], 0))?;
            let mut next = 1;
            for (i, wait) in waits().into_iter().enumerate() {
                let (y, x, s) = plan(i);
                if wait {
                    driver_call!(cuEventRecord(events[next], raw[1 - s]))?;
                    driver_call!(cuStreamWaitEvent(raw[s], events[next], 0))?;
                    next += 1;
                }
                launch_raw(raw[s], buffers[x].as_raw(), buffers[y].as_raw())?;
            }
            driver_call!(cuEventRecord(events[0], b))?;
            driver_call!(cuStreamWaitEvent(a, events[0], 0))?;
            driver_call!(cuStreamEndCapture(a, &mut graph))?;
            driver_call!(cuGraphInstantiateWithFlags(&mut exec, graph, 0))?;
            driver_call!(cuGraphUpload(exec, a))?;
        }
        Ok(RawGraph { graph, exec })
    }

    fn launch(&self, streams: &RawStreams) -> cuda_pinned::Result<()> {
        // SAFETY: a live executable graph and stream; the buffers live (the caller keeps them).
        unsafe { cuda_pinned::driver_call!(cuGraphLaunch(self.exec, streams.0[0])) }
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        // SAFETY: made in `capture`, destroyed once.
        unsafe {
            let _ = cuda_pinned::driver_call!(cuGraphExecDestroy(self.exec));
            let _ = cuda_pinned::driver_call!(cuGraphDestroy(self.graph));
        }
    }
}

/// The crossings of a step.
fn crossings() -> usize {
    (0..LAUNCHES)
        .filter(|&i| plan(i).1 % 2 != plan(i).2)
        .count()
}

/// Sets every buffer to its starting values (buffer `k` holds `k + 1` everywhere), on `stream`.
fn reset(
    stream: &Stream,
    host: &Pinned<f32>,
    buffers: &mut [DeviceBuffer<f32>],
) -> cuda_pinned::Result<()> {
    for (k, buffer) in buffers.iter_mut().enumerate() {
        stream.upload(&host.slice(k * ELEMENTS..(k + 1) * ELEMENTS)?, buffer)?;
    }
    stream.synchronize()
}

/// Every buffer's values, downloaded on `stream`.
fn contents(
    stream: &Stream,
    ctx: &Context,
    buffers: &[DeviceBuffer<f32>],
) -> cuda_pinned::Result<Vec<f32>> {
    let mut out = Pinned::<f32>::zeroed(ctx, BUFFERS * ELEMENTS)?;
    for (k, buffer) in buffers.iter().enumerate() {
        stream.download(
            buffer,
            &mut out.slice_mut(k * ELEMENTS..(k + 1) * ELEMENTS)?,
        )?;
    }
    Ok(out.as_slice()?.to_vec())
}

/// Microseconds since `start`.
fn us(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e6
}

pub fn measure(quick: bool) -> Outcome<Figures> {
    let rounds = if quick { 3 } else { 7 };
    let ctx = Context::on(0)?;
    let device = ctx.device().name()?;
    // The raw side's calls (event creation, the runtime's launches) take the thread's context.
    // SAFETY: a live context, current on this thread from now on.
    unsafe { cuda_pinned::driver_call!(cuCtxSetCurrent(ctx.as_raw())) }?;
    let (a, b) = (Stream::new(&ctx)?, Stream::new(&ctx)?);
    let streams = [&a, &b];
    let mut host = Pinned::<f32>::zeroed(&ctx, BUFFERS * ELEMENTS)?;
    for (i, v) in host.as_mut_slice()?.iter_mut().enumerate() {
        *v = (i / ELEMENTS + 1) as f32;
    }
    let raw_streams = RawStreams::new()?;
    let mut buffers: Vec<DeviceBuffer<f32>> = (0..BUFFERS)
        .map(|_| DeviceBuffer::zeroed(&a, ELEMENTS))
        .collect::<cuda_pinned::Result<_>>()?;
    let mut events = Vec::new();
    for _ in 0..=waits().iter().filter(|&&w| w).count() {
        let mut event = std::ptr::null_mut();
        let flags = cuda_pinned::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        // SAFETY: an out-pointer to a local; destroyed at the end.
        unsafe { cuda_pinned::driver_call!(cuEventCreate(&mut event, flags)) }?;
        events.push(event);
    }

    // Each way once from the same start: the same values.
    reset(&a, &host, &mut buffers)?;
    eager_step(streams, &mut buffers)?;
    a.synchronize()?;
    b.synchronize()?;
    let eager = contents(&a, &ctx, &buffers)?;
    reset(&a, &host, &mut buffers)?;
    let raw = RawGraph::capture(&raw_streams, &buffers, &events)?;
    raw.launch(&raw_streams)?;
    raw_streams.synchronize()?;
    let raw_values = contents(&a, &ctx, &buffers)?;
    reset(&a, &host, &mut buffers)?;
    let mut graph = Graph::capture(&[&a, &b], || eager_step(streams, &mut buffers))?;
    graph.launch(&a)?;
    let crate_values = contents(&a, &ctx, &buffers)?;
    let verified = eager == raw_values && eager == crate_values;

    let (mut raw_capture, mut crate_capture) = (Vec::new(), Vec::new());
    let (mut raw_wall, mut crate_wall) = (Vec::new(), Vec::new());
    let (mut raw_host, mut crate_host) = (Vec::new(), Vec::new());
    let (mut raw_synced, mut crate_synced) = (Vec::new(), Vec::new());
    let (mut eager_wall, mut eager_host) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.synchronize()?;
        let start = Instant::now();
        let again = RawGraph::capture(&raw_streams, &buffers, &events)?;
        raw_capture.push(us(start));
        drop(again);
        let start = Instant::now();
        let again = Graph::capture(&[&a, &b], || eager_step(streams, &mut buffers))?;
        crate_capture.push(us(start));
        drop(again);

        a.synchronize()?;
        let start = Instant::now();
        for _ in 0..REPLAYS {
            raw.launch(&raw_streams)?;
        }
        raw_host.push(us(start) / REPLAYS as f64);
        raw_streams.synchronize()?;
        raw_wall.push(us(start) / REPLAYS as f64);
        let start = Instant::now();
        for _ in 0..REPLAYS {
            graph.launch(&a)?;
        }
        crate_host.push(us(start) / REPLAYS as f64);
        a.synchronize()?;
        crate_wall.push(us(start) / REPLAYS as f64);

        for _ in 0..20 {
            let start = Instant::now();
            raw.launch(&raw_streams)?;
            raw_synced.push(us(start));
            raw_streams.synchronize()?;
            let start = Instant::now();
            graph.launch(&a)?;
            crate_synced.push(us(start));
            a.synchronize()?;
        }

        let start = Instant::now();
        eager_step(streams, &mut buffers)?;
        eager_host.push(us(start));
        a.synchronize()?;
        b.synchronize()?;
        eager_wall.push(us(start));
    }
    drop(raw);
    drop(graph);
    drop(raw_streams);
    ctx.synchronize()?;
    for event in events {
        // SAFETY: created above, no longer used.
        unsafe { cuda_pinned::driver_call!(cuEventDestroy_v2(event)) }?;
    }
    let raw = Side {
        capture_us: median(raw_capture),
        replay_wall_us: median(raw_wall),
        launch_host_us: median(raw_host),
        launch_after_sync_us: median(raw_synced),
    };
    let crate_ = Side {
        capture_us: median(crate_capture),
        replay_wall_us: median(crate_wall),
        launch_host_us: median(crate_host),
        launch_after_sync_us: median(crate_synced),
    };
    let eager_wall_us = median(eager_wall);
    Ok(Figures {
        device,
        launches: LAUNCHES,
        buffers: BUFFERS,
        crossings: crossings(),
        rounds,
        capture_ratio: crate_.capture_us / raw.capture_us,
        replay_ratio: crate_.replay_wall_us / raw.replay_wall_us,
        launch_extra_us: crate_.launch_host_us - raw.launch_host_us,
        launch_after_sync_extra_us: crate_.launch_after_sync_us - raw.launch_after_sync_us,
        eager_over_replay: eager_wall_us / crate_.replay_wall_us,
        eager_wall_us,
        eager_host_us: median(eager_host),
        raw,
        crate_,
        verified,
    })
}

pub fn table(f: &Figures) -> String {
    let mut out = format!(
        "Graphs on {} (a step of {} launches over {} buffers on 2 streams, {} crossings; medians of {} rounds):\n",
        f.device, f.launches, f.buffers, f.crossings, f.rounds
    );
    out.push_str(&format!(
        "{:<20} {:>13} {:>13} {:>22} {:>22}\n",
        "", "capture (us)", "step (us)", "launch, in a loop (us)", "launch, after sync (us)"
    ));
    for (name, side) in [("raw driver graph", &f.raw), ("crate Graph", &f.crate_)] {
        out.push_str(&format!(
            "{name:<20} {:>13.0} {:>13.1} {:>22.2} {:>22.2}\n",
            side.capture_us, side.replay_wall_us, side.launch_host_us, side.launch_after_sync_us
        ));
    }
    out.push_str(&format!(
        "{:<20} {:>13} {:>13.1} {:>22.0}\n",
        "crate, eager", "-", f.eager_wall_us, f.eager_host_us
    ));
    out.push_str(&format!(
        "crate / raw: capture {:.2}x (goal <= 1.5), step {:.3}x (goal <= 1.05), launch {:+.2} us in a loop \
         (goal <= +2), {:+.2} us after a sync\neager / replayed: {:.1}x (goal >= 4)\nresults {}\n",
        f.capture_ratio,
        f.replay_ratio,
        f.launch_extra_us,
        f.launch_after_sync_extra_us,
        f.eager_over_replay,
        if f.verified { "verified" } else { "WRONG" }
    ));
    out
}
