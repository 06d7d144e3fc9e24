//! `pinbench futures`: how soon a task awaiting device work learns that it is done, against a thread spinning
//! on `cuStreamQuery` for the same work, and what the reactor behind the futures costs.
//!
//! One trial: device work of [`WORK`] (the crate's spin kernel with feature `gpu`, else a device-to-device copy)
//! is queued on a stream, then the stream's point (`Stream::done`). A reference thread spins on the stream's
//! query and notes when it first reads it complete; this thread awaits the future on a minimal executor that
//! sleeps (parks) until woken, and notes when the future returns. The trial's figure is the difference: the
//! extra latency of the future over the fastest the host can know. Measured with one future pending, with
//! [`CROWD`] more pending on other streams (held busy meanwhile), and with the future spinning first
//! (`Done::spin_for`). Then [`MANY`] futures pending at once, and the process's CPU time while nothing is.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

#[cfg(not(feature = "gpu"))]
use cuda_pinned::DeviceBuffer;
use cuda_pinned::{Context, Done, Event, Stream};
use serde::Serialize;

use crate::Outcome;

/// The device work before each point.
const WORK: Duration = Duration::from_micros(50);
/// Futures pending meanwhile in the crowded measurement.
const CROWD: usize = 10_000;
/// Futures pending at once in the capacity measurement.
const MANY: usize = 100_000;
/// Of those, stream points (over [`BUSY_STREAMS`] streams held busy); the others are futures of [`EVENTS`]
/// events recorded among them. A device takes only so many operations queued behind running kernels before the
/// driver makes the next enqueue wait (see [`queue_depth`]).
const POINTS: usize = 1000;
const BUSY_STREAMS: usize = 10;
const EVENTS: usize = 100;

/// What `pinbench futures` measured.
#[derive(Debug, Serialize)]
pub struct Figures {
    pub device: String,
    pub trials: usize,
    pub work_us: f64,
    /// One future pending, its executor thread asleep.
    pub alone: Latency,
    /// The same with [`CROWD`] more pending.
    pub crowded: Latency,
    /// How many of the crowd were still pending once all were registered.
    pub crowd_pending: usize,
    /// The future spinning first (`Done::spin_for`), nothing else pending.
    pub spinning: Latency,
    /// Futures registered at once, how many of them were still pending once all were registered, and how long
    /// after their streams' work the last of them completed.
    pub many: usize,
    pub many_pending: usize,
    pub many_last_after_ms: f64,
    /// The process's CPU time over a second with nothing pending, in milliseconds.
    pub idle_cpu_ms: f64,
    /// How many stream points were queued behind a running kernel before an enqueue waited: on one stream, and
    /// round-robin over eight (`None`: none waited up to [`DEPTH_PROBE`]).
    pub queue_depth_one_stream: Option<usize>,
    pub queue_depth_eight_streams: Option<usize>,
}

/// Extra latency over the spinning reference, in microseconds.
#[derive(Debug, Serialize)]
pub struct Latency {
    pub pending: usize,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
}

/// Runs every measurement on device 0.
pub fn measure(quick: bool) -> Outcome<Figures> {
    let ctx = Context::on(0)?;
    let trials = if quick { 300 } else { 2000 };
    let stream = Stream::new(&ctx)?;
    let work = Work::new(&stream)?;
    // Warm-up: the kernel loaded, the reactor's thread and flags made.
    for _ in 0..20 {
        work.queue(&stream)?;
        block_on(stream.done())?;
    }
    let alone = latency(&stream, &work, trials, 0, None)?;
    let spinning = latency(&stream, &work, trials, 0, Some(Duration::from_millis(1)))?;
    // The crowd's streams stay busy for longer than the trials take.
    let crowd_busy = Duration::from_millis(500) + Duration::from_micros(300) * trials as u32;
    let (crowded, crowd_pending) = {
        let mut crowd = Crowd::new(&ctx, CROWD, crowd_busy)?;
        let pending = crowd.still_pending()?;
        let figure = latency(&stream, &work, trials, CROWD, None)?;
        crowd.finish()?;
        (figure, pending)
    };
    let started = Instant::now();
    let mut crowd = Crowd::new(&ctx, MANY, Duration::from_secs(2))?;
    let many_pending = crowd.still_pending()?;
    let work_end = crowd.finish()?;
    let many_last_after_ms = (Instant::now() - work_end.max(started)).as_secs_f64() * 1e3;
    let idle_cpu_ms = idle_cpu(Duration::from_secs(1))?;
    let queue_depth_one_stream = queue_depth(&ctx, 1)?;
    let queue_depth_eight_streams = queue_depth(&ctx, 8)?;
    Ok(Figures {
        device: ctx.device().name()?,
        trials,
        work_us: WORK.as_secs_f64() * 1e6,
        alone,
        crowded,
        spinning,
        many: MANY,
        many_pending,
        many_last_after_ms,
        idle_cpu_ms,
        queue_depth_one_stream,
        queue_depth_eight_streams,
        crowd_pending,
    })
}

/// Device work of about [`WORK`] on a stream.
struct Work {
    #[cfg(not(feature = "gpu"))]
    buffers: std::cell::RefCell<(DeviceBuffer<u8>, DeviceBuffer<u8>)>,
}

impl Work {
    fn new(stream: &Stream) -> Outcome<Work> {
        let _ = stream;
        Ok(Work {
            #[cfg(not(feature = "gpu"))]
            buffers: std::cell::RefCell::new((
                DeviceBuffer::zeroed(stream, 16 << 20)?,
                DeviceBuffer::zeroed(stream, 16 << 20)?,
            )),
        })
    }

    fn queue(&self, stream: &Stream) -> Outcome<()> {
        #[cfg(feature = "gpu")]
        cuda_pinned::kernels::spin(stream, WORK)?;
        #[cfg(not(feature = "gpu"))]
        {
            let (src, dst) = &mut *self.buffers.borrow_mut();
            stream.copy(&*src, dst)?;
        }
        Ok(())
    }
}

/// Futures pending on streams held busy by other work, polled once each so that the reactor watches them.
struct Crowd {
    streams: Vec<Stream>,
    pending: Vec<Done>,
    _events: Vec<Event>,
}

impl Crowd {
    /// `count` futures: [`POINTS`] stream points over [`BUSY_STREAMS`] streams, each busy for about `busy`,
    /// and futures of [`EVENTS`] events recorded among them for the rest.
    fn new(ctx: &Context, count: usize, busy: Duration) -> Outcome<Crowd> {
        let streams: Vec<Stream> = (0..BUSY_STREAMS)
            .map(|_| Stream::new(ctx))
            .collect::<cuda_pinned::Result<_>>()?;
        for stream in &streams {
            hold(stream, busy)?;
        }
        let mut pending = Vec::with_capacity(count);
        let mut events = Vec::with_capacity(EVENTS);
        for i in 0..POINTS.min(count) {
            let stream = &streams[i % streams.len()];
            pending.push(stream.done());
            if i % (POINTS / EVENTS) == 0 {
                let event = Event::without_timing(ctx)?;
                event.record(stream)?;
                events.push(event);
            }
        }
        for i in pending.len()..count {
            pending.push(events[i % events.len()].done());
        }
        for done in &mut pending {
            if let Poll::Ready(outcome) = poll_once(done) {
                outcome?;
            }
        }
        Ok(Crowd {
            streams,
            pending,
            _events: events,
        })
    }

    /// How many of the futures are still pending.
    fn still_pending(&mut self) -> Outcome<usize> {
        let mut pending = 0;
        for done in &mut self.pending {
            match poll_once(done) {
                Poll::Pending => pending += 1,
                Poll::Ready(outcome) => outcome?,
            }
        }
        Ok(pending)
    }

    /// Waits for every future; when the streams' work ended (the latest a spinning query saw).
    fn finish(self) -> Outcome<Instant> {
        let mut end = Instant::now();
        for stream in &self.streams {
            while !stream.query()? {
                std::hint::spin_loop();
            }
            end = Instant::now();
        }
        for done in self.pending {
            block_on(done)?;
        }
        Ok(end)
    }
}

/// Stream points the queue-depth probe queues at most.
const DEPTH_PROBE: usize = 4096;

/// How many stream points `streams` streams (round-robin), held busy by a running kernel each, take before an
/// enqueue waits (more than 10 ms): the driver's queue depth as an enqueue sees it. `None` if none waited up to
/// [`DEPTH_PROBE`].
fn queue_depth(ctx: &Context, streams: usize) -> Outcome<Option<usize>> {
    let streams: Vec<Stream> = (0..streams)
        .map(|_| Stream::new(ctx))
        .collect::<cuda_pinned::Result<_>>()?;
    for stream in &streams {
        hold(stream, Duration::from_secs(1))?;
    }
    let mut points = Vec::with_capacity(DEPTH_PROBE);
    let mut depth = None;
    for i in 0..DEPTH_PROBE {
        let started = Instant::now();
        points.push(streams[i % streams.len()].done());
        if started.elapsed() > Duration::from_millis(10) {
            depth = Some(i);
            break;
        }
    }
    for done in points {
        block_on(done)?;
    }
    Ok(depth)
}

/// Keeps `stream` busy for about `duration`.
fn hold(stream: &Stream, duration: Duration) -> Outcome<()> {
    #[cfg(feature = "gpu")]
    cuda_pinned::kernels::spin(stream, duration)?;
    #[cfg(not(feature = "gpu"))]
    {
        let _ = duration;
        let mut a = DeviceBuffer::<u8>::zeroed(stream, 64 << 20)?;
        let b = DeviceBuffer::<u8>::zeroed(stream, 64 << 20)?;
        stream.copy(&b, &mut a)?;
    }
    Ok(())
}

/// `trials` trials on `stream` (see the module docs), the future spinning first for `spin` if given.
fn latency(
    stream: &Stream,
    work: &Work,
    trials: usize,
    pending: usize,
    spin: Option<Duration>,
) -> Outcome<Latency> {
    // The reference thread: at each trial, spins on the stream's query and notes when it reads it complete
    // (nanoseconds since `epoch`).
    let epoch = Instant::now();
    let seen = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(Barrier::new(2));
    let reference = {
        let (stream, seen, stop, go) = (stream.clone(), seen.clone(), stop.clone(), go.clone());
        std::thread::spawn(move || -> cuda_pinned::Result<()> {
            loop {
                go.wait();
                if stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                while !stream.query()? {
                    std::hint::spin_loop();
                }
                seen.store(since(epoch), Ordering::Release);
                go.wait();
            }
        })
    };
    let mut extra = Vec::with_capacity(trials);
    let mut failed = None;
    for _ in 0..trials {
        if let Err(e) = work.queue(stream) {
            failed = Some(e);
            break;
        }
        let mut done = stream.done();
        if let Some(limit) = spin {
            done = done.spin_for(limit);
        }
        go.wait();
        let outcome = block_on(done);
        let awaited = since(epoch);
        go.wait();
        if let Err(e) = outcome {
            failed = Some(e.into());
            break;
        }
        let reference = seen.load(Ordering::Acquire);
        extra.push((awaited as f64 - reference as f64) / 1e3);
    }
    stop.store(true, Ordering::Release);
    go.wait();
    reference
        .join()
        .map_err(|_| "the reference thread panicked")??;
    if let Some(e) = failed {
        return Err(e);
    }
    extra.sort_by(f64::total_cmp);
    let at = |q: f64| extra[((extra.len() - 1) as f64 * q).round() as usize];
    Ok(Latency {
        pending,
        median_us: at(0.5),
        p90_us: at(0.9),
        p99_us: at(0.99),
    })
}

fn since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Runs `future` on this thread, which sleeps (parked) until the future's waker wakes it: an executor thread
/// with nothing else to do.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::pin::Pin::new(future).poll(&mut TaskContext::from_waker(Waker::noop()))
}

/// The process's CPU time (user and system) over `window` in which it only sleeps, in milliseconds: with
/// nothing pending, the reactor's thread sleeps too.
fn idle_cpu(window: Duration) -> Outcome<f64> {
    let before = cpu_time()?;
    std::thread::sleep(window);
    Ok((cpu_time()? - before).as_secs_f64() * 1e3)
}

/// The process's CPU time so far, from `/proc/self/stat` (utime and stime, in clock ticks of 10 ms).
fn cpu_time() -> Outcome<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The fields after the command's name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').ok_or("unreadable /proc/self/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .ok_or("unreadable /proc/self/stat")?
        .iter()
        .map(|f| f.parse::<u64>())
        .sum::<Result<u64, _>>()?;
    Ok(Duration::from_millis(ticks * 10))
}

/// The report.
pub fn table(f: &Figures) -> String {
    let mut out = format!(
        "Futures of device work on {} ({} trials, {:.0} us of device work each; extra latency over a thread \
         spinning on cuStreamQuery, us)\n",
        f.device, f.trials, f.work_us
    );
    out.push_str(&format!(
        "{:<44} {:>8} {:>8} {:>8} {:>8}\n",
        "", "pending", "median", "p90", "p99"
    ));
    for (name, l) in [
        ("awaited, executor thread asleep", &f.alone),
        ("awaited, executor asleep, others pending", &f.crowded),
        ("awaited, spinning first (spin_for 1 ms)", &f.spinning),
    ] {
        out.push_str(&format!(
            "{name:<44} {:>8} {:>8.2} {:>8.2} {:>8.2}\n",
            l.pending, l.median_us, l.p90_us, l.p99_us
        ));
    }
    out.push_str(&format!(
        "(the others pending: {} of {} still pending once registered; {POINTS} stream points on {BUSY_STREAMS} \
         busy streams, the rest futures of {EVENTS} events)\n",
        f.crowd_pending, f.crowded.pending
    ));
    out.push_str(&format!(
        "{} futures registered ({} of them pending at once): the last completed {:.2} ms after their streams' \
         work\n",
        f.many, f.many_pending, f.many_last_after_ms
    ));
    let depth = |d: Option<usize>| d.map_or(format!("over {DEPTH_PROBE}"), |d| d.to_string());
    out.push_str(&format!(
        "Stream points queued behind a running kernel before an enqueue waited: {} on one stream, {} over eight\n",
        depth(f.queue_depth_one_stream),
        depth(f.queue_depth_eight_streams)
    ));
    out.push_str(&format!(
        "CPU time of the process over 1 s with nothing pending: {:.0} ms\n",
        f.idle_cpu_ms
    ));
    out
}
