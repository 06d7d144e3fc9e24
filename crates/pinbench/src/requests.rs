//! `pinbench requests`: a server's requests, each an upload, a kernel and a download whose result the request
//! reads, served two ways with the same number in flight: as tasks on tokio that await the device
//! (`Pinned::writable` / `readable`), with 4, 8, 16 and one per core worker threads, and on blocking threads,
//! one per request in flight, whose accessors wait in the driver (`as_mut_slice` / `as_slice`). Figures:
//! requests per second each way and the ratios.
//!
//! Each request in flight owns its page-locked input and output and its device buffers (made before the clock
//! starts, as a server's pool would hold them) and uses one of [`STREAMS`] streams. A request writes its input
//! (from its number), uploads it, runs `axpy` (y = 2x, after a fill of y; with feature `gpu`, else the upload
//! is copied back as is), downloads y and checks three of its elements.

use std::sync::Arc;
use std::time::Instant;

use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
use serde::Serialize;

use crate::Outcome;

/// Streams the requests share.
const STREAMS: usize = 32;
/// Elements (f32) of a request's input and output: 64 KiB each.
const ELEMENTS: usize = 16 << 10;

/// What `pinbench requests` measured.
#[derive(Debug, Serialize)]
pub struct Figures {
    pub device: String,
    /// Requests in flight at once, each way.
    pub in_flight: usize,
    /// Requests each request slot serves in a run.
    pub rounds: usize,
    /// Bytes uploaded, and as many downloaded, per request.
    pub bytes_each_way: usize,
    /// The awaited design on tokio, for each number of worker threads tried.
    pub awaited: Vec<Awaited>,
    pub blocking_per_s: f64,
    /// The best awaited rate over the blocking one.
    pub best_ratio: f64,
    /// Whether every request read the right result, every way.
    pub verified: bool,
}

/// The awaited design with `threads` tokio workers.
#[derive(Debug, Serialize)]
pub struct Awaited {
    pub threads: usize,
    pub per_s: f64,
    /// `per_s / blocking_per_s`.
    pub ratio: f64,
}

/// What one request in flight owns.
struct Slot {
    stream: Stream,
    input: Pinned<f32>,
    output: Pinned<f32>,
    x: DeviceBuffer<f32>,
    y: DeviceBuffer<f32>,
}

impl Slot {
    fn new(ctx: &Context, stream: &Stream) -> cuda_pinned::Result<Slot> {
        Ok(Slot {
            stream: stream.clone(),
            input: Pinned::zeroed(ctx, ELEMENTS)?,
            output: Pinned::zeroed(ctx, ELEMENTS)?,
            x: DeviceBuffer::zeroed(stream, ELEMENTS)?,
            y: DeviceBuffer::zeroed(stream, ELEMENTS)?,
        })
    }

    /// The input of request `id`.
    fn write_input(id: usize, input: &mut [f32]) {
        for (i, x) in input.iter_mut().enumerate() {
            *x = ((id + i) % 1024) as f32;
        }
    }

    /// Queues the upload, the kernel and the download of the input written.
    fn queue(&mut self) -> cuda_pinned::Result<()> {
        self.stream.upload(&self.input, &mut self.x)?;
        #[cfg(feature = "gpu")]
        {
            cuda_pinned::kernels::fill(&self.stream, &mut self.y, 0.0f32)?;
            cuda_pinned::kernels::axpy(&self.stream, 2.0, &self.x, &mut self.y)?;
        }
        #[cfg(not(feature = "gpu"))]
        self.stream.copy(&self.x, &mut self.y)?;
        self.stream.download(&self.y, &mut self.output)
    }

    /// Whether request `id`'s output is right (three elements).
    fn check(id: usize, output: &[f32]) -> bool {
        let factor = if cfg!(feature = "gpu") { 2.0 } else { 1.0 };
        [0, ELEMENTS / 2, ELEMENTS - 1]
            .iter()
            .all(|&i| output[i] == factor * ((id + i) % 1024) as f32)
    }

    /// One request, awaited.
    async fn serve_async(&mut self, id: usize) -> cuda_pinned::Result<bool> {
        Slot::write_input(id, self.input.writable().await?);
        self.queue()?;
        Ok(Slot::check(id, self.output.readable().await?))
    }

    /// One request, with the accessors that wait in the driver.
    fn serve_blocking(&mut self, id: usize) -> cuda_pinned::Result<bool> {
        Slot::write_input(id, self.input.as_mut_slice()?);
        self.queue()?;
        Ok(Slot::check(id, self.output.as_slice()?))
    }
}

/// Runs both ways on device 0: `in_flight` requests at once, `rounds` each.
pub fn measure(quick: bool) -> Outcome<Figures> {
    let in_flight = 1000;
    let rounds = if quick { 10 } else { 50 };
    let ctx = Context::on(0)?;
    let streams: Vec<Stream> = (0..STREAMS)
        .map(|_| Stream::new(&ctx))
        .collect::<cuda_pinned::Result<_>>()?;
    let slots: Vec<Slot> = (0..in_flight)
        .map(|i| Slot::new(&ctx, &streams[i % STREAMS]))
        .collect::<cuda_pinned::Result<_>>()?;
    let cores = std::thread::available_parallelism().map_or(4, usize::from);
    let mut threads: Vec<usize> = [4, 8, 16, cores]
        .into_iter()
        .filter(|&t| t <= cores)
        .collect();
    threads.dedup();
    let runtimes: Vec<tokio::runtime::Runtime> = threads
        .iter()
        .map(|&t| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(t)
                .build()
        })
        .collect::<Result<_, _>>()?;
    // Warm-up of every way: a round each.
    let mut slots = slots;
    for runtime in &runtimes {
        slots = run_async(runtime, slots, 1)?.0;
    }
    let (mut slots, _) = run_blocking(slots, 1)?;
    let mut verified = true;
    let mut awaited = vec![0.0f64; runtimes.len()];
    let mut blocking_per_s = 0.0f64;
    let requests = (in_flight * rounds) as f64;
    // Alternating, twice each: the better of two runs each way.
    for _ in 0..2 {
        for (best, runtime) in awaited.iter_mut().zip(&runtimes) {
            let start = Instant::now();
            let (back, right) = run_async(runtime, slots, rounds)?;
            *best = best.max(requests / start.elapsed().as_secs_f64());
            verified &= right;
            slots = back;
        }
        let start = Instant::now();
        let (back, right) = run_blocking(slots, rounds)?;
        blocking_per_s = blocking_per_s.max(requests / start.elapsed().as_secs_f64());
        verified &= right;
        slots = back;
    }
    let awaited: Vec<Awaited> = threads
        .iter()
        .zip(awaited)
        .map(|(&threads, per_s)| Awaited {
            threads,
            per_s,
            ratio: per_s / blocking_per_s,
        })
        .collect();
    Ok(Figures {
        device: ctx.device().name()?,
        in_flight,
        rounds,
        bytes_each_way: ELEMENTS * size_of::<f32>(),
        best_ratio: awaited.iter().map(|a| a.ratio).fold(0.0, f64::max),
        awaited,
        blocking_per_s,
        verified,
    })
}

/// Every slot a task on `runtime`, serving `rounds` requests; the slots back, and whether every result was
/// right.
fn run_async(
    runtime: &tokio::runtime::Runtime,
    slots: Vec<Slot>,
    rounds: usize,
) -> Outcome<(Vec<Slot>, bool)> {
    let tasks: Vec<_> = slots
        .into_iter()
        .enumerate()
        .map(|(n, mut slot)| {
            runtime.spawn(async move {
                let mut right = true;
                for round in 0..rounds {
                    right &= slot.serve_async(n * rounds + round).await?;
                }
                Ok::<_, cuda_pinned::Error>((slot, right))
            })
        })
        .collect();
    let mut back = Vec::with_capacity(tasks.len());
    let mut all_right = true;
    for task in tasks {
        let (slot, right) = runtime.block_on(task)??;
        back.push(slot);
        all_right &= right;
    }
    Ok((back, all_right))
}

/// Every slot a thread of its own, serving `rounds` requests; as [`run_async`].
fn run_blocking(slots: Vec<Slot>, rounds: usize) -> Outcome<(Vec<Slot>, bool)> {
    let start = Arc::new(std::sync::Barrier::new(slots.len()));
    let threads: Vec<_> = slots
        .into_iter()
        .enumerate()
        .map(|(n, mut slot)| {
            let start = start.clone();
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    start.wait();
                    let mut right = true;
                    for round in 0..rounds {
                        right &= slot.serve_blocking(n * rounds + round)?;
                    }
                    Ok::<_, cuda_pinned::Error>((slot, right))
                })
        })
        .collect::<Result<_, _>>()?;
    let mut back = Vec::with_capacity(threads.len());
    let mut all_right = true;
    for thread in threads {
        let (slot, right) = thread.join().map_err(|_| "a request thread panicked")??;
        back.push(slot);
        all_right &= right;
    }
    Ok((back, all_right))
}

/// The report.
pub fn table(f: &Figures) -> String {
    let kib = f.bytes_each_way >> 10;
    let mut out = format!(
        "Requests on {} ({} in flight, {} rounds each; {kib} KiB uploaded, a kernel, {kib} KiB downloaded and \
         read):\n",
        f.device, f.in_flight, f.rounds
    );
    for a in &f.awaited {
        let name = format!("tokio, {} worker threads, awaited", a.threads);
        out.push_str(&format!(
            "{name:<44} {:>12.0} requests/s  {:>6.2}x\n",
            a.per_s, a.ratio
        ));
    }
    let name = format!("{} blocking threads", f.in_flight);
    out.push_str(&format!(
        "{name:<44} {:>12.0} requests/s\nresults {}\n",
        f.blocking_per_s,
        if f.verified { "verified" } else { "WRONG" }
    ));
    out
}
