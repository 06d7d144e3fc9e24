//! Streams: each a worker thread that runs its queue in order, every operation after a random delay, so work
//! the crate forgot to order runs in the wrong order and shows as wrong data. Operations check, when they
//! run, that the memory they touch is still there.

use std::cell::Cell;
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::detect;
use crate::sim::{Kind, Loc, Op, SIM, State, StreamData};
use crate::sys::CUresult;

thread_local! {
    /// On a stream's worker thread, the stream's handle.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The stream whose worker is the calling thread (running a host function that makes a driver call), if any.
pub(crate) fn current_worker() -> Option<usize> {
    WORKER.get()
}

/// Creates a stream and its worker; the handle.
pub(crate) fn create(
    state: &mut State,
    device: i32,
    flags: u32,
    priority: i32,
) -> Result<usize, CUresult> {
    let handle = state.handle();
    let data = StreamData {
        device,
        flags,
        priority,
        queue: Default::default(),
        destroyed: false,
        depends: Vec::new(),
        capture: None,
    };
    state.streams.insert(handle, data);
    state.finished.insert(handle, 0);
    let seed = SIM.config.seed ^ (handle as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let spawned = std::thread::Builder::new()
        .name(format!("sim-stream-{handle:#x}"))
        .spawn(move || worker(handle, seed));
    match spawned {
        Ok(worker) => {
            let mut workers = SIM.workers.lock().unwrap_or_else(PoisonError::into_inner);
            workers.push((handle, worker));
            Ok(handle)
        }
        Err(_) => {
            state.streams.remove(&handle);
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Counts the references `op` holds, so memory freed and events destroyed under it are noticed.
pub(crate) fn hold(state: &mut State, op: &Op) {
    for id in op.allocations() {
        if let Some(allocation) = state.allocations.get_mut(&id) {
            allocation.pending += 1;
        }
    }
    if let Op::Record { event, .. } | Op::Wait { event, .. } = *op
        && let Some(e) = state.events.get_mut(&event)
    {
        e.refs += 1;
    }
}

/// Drops the references of a finished `op`.
fn release(state: &mut State, op: &Op) {
    for id in op.allocations() {
        if let Some(allocation) = state.allocations.get_mut(&id) {
            allocation.pending -= 1;
        }
    }
    if let Op::Record { event, .. } | Op::Wait { event, .. } = *op
        && let Some(e) = state.events.get_mut(&event)
    {
        e.refs -= 1;
        if e.destroyed && e.refs == 0 {
            state.events.remove(&event);
        }
    }
}

/// Queues `op` on stream `handle` (which the caller checked); with `wait`, returns when it has run. Judges it
/// first against the work the stream was made to wait for (see `detect.rs`).
pub(crate) fn submit<'a>(
    mut state: MutexGuard<'a, State>,
    handle: usize,
    op: Op,
    wait: bool,
) -> MutexGuard<'a, State> {
    let false_dependencies = detect::judge(&mut state, handle, &op);
    hold(&mut state, &op);
    let stream = state
        .streams
        .get_mut(&handle)
        .expect("submit: the caller checked the stream");
    stream.queue.push_back(op);
    // Ours is done once it and those queued before it have left the front.
    let target = finished(&state, handle) + state.streams[&handle].queue.len() as u64;
    SIM.changed.notify_all();
    if !false_dependencies.is_empty() {
        // Naming the caller reads debug information: not under the lock, which every stream needs.
        drop(state);
        let caller = detect::caller_frames();
        state = SIM.lock();
        for found in false_dependencies {
            if let Some(report) = found.report(&caller) {
                state.finding(report);
            }
        }
    }
    if wait {
        state = SIM.wait_until(state, |s| finished(s, handle) >= target);
    }
    state
}

/// Runs `op` in the caller's thread, now (the null stream, synchronous copies, pageable memory).
pub(crate) fn run_now<'a>(
    mut state: MutexGuard<'a, State>,
    op: Op,
    stream: usize,
) -> MutexGuard<'a, State> {
    hold(&mut state, &op);
    state = execute(state, &op, stream);
    release(&mut state, &op);
    SIM.changed.notify_all();
    state
}

/// How many operations stream `handle` has finished; all of them, once it is gone.
pub(crate) fn finished(state: &State, handle: usize) -> u64 {
    state.finished.get(&handle).copied().unwrap_or(u64::MAX)
}

fn worker(handle: usize, seed: u64) {
    WORKER.set(Some(handle));
    let mut rng = Rng(seed | 1);
    let mut state = SIM.lock();
    loop {
        state = SIM.wait_until(state, |s| {
            let stream = &s.streams[&handle];
            !stream.queue.is_empty() || stream.destroyed
        });
        if faulted(&state, handle) {
            abandon(&mut state, handle);
            continue;
        }
        let Some(op) = state.streams[&handle].queue.front().cloned() else {
            // Destroyed and drained.
            state.streams.remove(&handle);
            state.finished.remove(&handle);
            SIM.changed.notify_all();
            return;
        };
        drop(state);
        let delay = rng.delay(SIM.config.max_delay);
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        state = SIM.lock();
        if faulted(&state, handle) {
            abandon(&mut state, handle);
            continue;
        }
        state = execute(state, &op, handle);
        state
            .streams
            .get_mut(&handle)
            .expect("a stream lives while its worker runs")
            .queue
            .pop_front();
        *state.finished.entry(handle).or_insert(0) += 1;
        release(&mut state, &op);
        SIM.changed.notify_all();
    }
}

/// Whether stream `handle` has work queued that its context's sticky error drops.
fn faulted(state: &State, handle: usize) -> bool {
    let stream = &state.streams[&handle];
    !stream.queue.is_empty() && state.faulted.contains_key(&stream.device)
}

/// Drops the work queued on stream `handle` without running it, its context having a sticky error
/// ([`State::fault`]): counted as finished, so that waits for the queue end (and then fail), but nothing of it
/// happens, and the event records among it never fire.
fn abandon(state: &mut State, handle: usize) {
    let dropped: Vec<Op> = state
        .streams
        .get_mut(&handle)
        .expect("a stream lives while its worker runs")
        .queue
        .drain(..)
        .collect();
    *state.finished.entry(handle).or_insert(0) += dropped.len() as u64;
    for op in &dropped {
        release(state, op);
    }
    SIM.changed.notify_all();
}

/// A resolved place: where to copy, and the allocation marked as executing, if any.
struct Place {
    address: *mut u8,
    allocation: Option<u64>,
}

/// Finds where `loc` is now, marking its allocation as in use; `None` (after recording a violation) where
/// the memory is gone or not yet there.
fn place(state: &mut State, loc: Loc, op: &Op, stream: usize) -> Option<Place> {
    let (id, offset) = match loc {
        Loc::Pageable(address) => {
            return Some(Place {
                address: address as *mut u8,
                allocation: None,
            });
        }
        Loc::Alloc { id, offset } => (id, offset),
    };
    let Some(allocation) = state.allocations.get_mut(&id) else {
        let message = format!(
            "{} queued on stream {stream:#x} ran after the memory it touches was freed or unregistered",
            op.describe()
        );
        state.violation(message);
        return None;
    };
    if allocation.kind == Kind::DeviceAsync && !allocation.ready {
        let message = format!(
            "{} queued on stream {stream:#x} touched device memory {:#x} before its stream-ordered allocation \
             was reached",
            op.describe(),
            allocation.base
        );
        state.violation(message);
        return None;
    }
    allocation.executing += 1;
    Some(Place {
        address: allocation.host_address(offset),
        allocation: Some(id),
    })
}

fn done_with(state: &mut State, places: &[&Option<Place>]) {
    for place in places.iter().filter_map(|p| p.as_ref()) {
        if let Some(allocation) = place
            .allocation
            .and_then(|id| state.allocations.get_mut(&id))
        {
            allocation.executing -= 1;
        }
    }
}

/// Carries out `op` (with the lock held except while moving bytes or calling a host function or a kernel's
/// stand-in).
pub(crate) fn execute<'a>(
    mut state: MutexGuard<'a, State>,
    op: &Op,
    stream: usize,
) -> MutexGuard<'a, State> {
    match *op {
        Op::Copy { dst, src, bytes } => {
            let (to, from) = (
                place(&mut state, dst, op, stream),
                place(&mut state, src, op, stream),
            );
            if let (Some(to), Some(from)) = (&to, &from) {
                drop(state);
                // SAFETY: both places were checked at submission to hold `bytes` bytes, and their memory
                // cannot go while they are marked executing (freeing waits for that); `copy` allows overlap.
                unsafe { std::ptr::copy(from.address, to.address, bytes) };
                state = SIM.lock();
            }
            done_with(&mut state, &[&to, &from]);
        }
        Op::Set {
            dst,
            value,
            size,
            count,
        } => {
            let to = place(&mut state, dst, op, stream);
            if let Some(to) = &to {
                drop(state);
                let pattern = &value.to_le_bytes()[..size];
                let total = count * size;
                // The pattern once, then what is filled copied after itself, doubling: a few large copies rather
                // than one per element.
                // SAFETY: the place holds count * size bytes (checked at submission) and cannot go while marked
                // executing; each copy reads the filled bytes and writes the next ones, which do not overlap.
                unsafe {
                    if total > 0 {
                        std::ptr::copy_nonoverlapping(pattern.as_ptr(), to.address, size);
                    }
                    let mut filled = size;
                    while filled < total {
                        let n = filled.min(total - filled);
                        std::ptr::copy_nonoverlapping(to.address, to.address.add(filled), n);
                        filled += n;
                    }
                }
                state = SIM.lock();
            }
            done_with(&mut state, &[&to]);
        }
        Op::Record { event, generation } => {
            if let Some(e) = state.events.get_mut(&event) {
                e.pending.remove(&generation);
                e.time = Some(Instant::now());
            }
        }
        Op::Wait { event, generation } => {
            // A record dropped by its context's sticky error never fires: the wait ends then.
            state = SIM.wait_until(state, |s| {
                s.events.get(&event).is_none_or(|e| {
                    !e.pending.contains(&generation) || s.faulted.contains_key(&e.device)
                })
            });
        }
        Op::Host(call) => {
            drop(state);
            // SAFETY: the crate passed this function and argument to cuLaunchHostFunc, whose contract is
            // that the function may be called with the argument once the stream reaches it.
            unsafe { (call.f)(call.data as *mut std::ffi::c_void) };
            state = SIM.lock();
        }
        Op::Allocate { id } => {
            if let Some(allocation) = state.allocations.get_mut(&id) {
                allocation.ready = true;
            }
        }
        Op::Graph(ref launch) => {
            state = crate::graph::run(state, launch, stream);
        }
        Op::Kernel(ref launch) => {
            drop(state);
            let violations = crate::kernel::run(launch, stream);
            state = SIM.lock();
            for violation in violations {
                state.violation(violation);
            }
        }
        Op::Free { id } => {
            let pending = state.allocations.get(&id).map_or(0, |a| a.pending);
            if pending > 0 {
                let base = state.allocations[&id].base;
                let message = format!(
                    "cuMemFreeAsync on stream {stream:#x} freed device memory {base:#x} while queued work still \
                     uses it: {}",
                    state.users(id)
                );
                state.violation(message);
            }
            state = SIM.wait_until(state, |s| {
                s.allocations.get(&id).is_none_or(|a| a.executing == 0)
            });
            state.unmap(id);
        }
    }
    state
}

/// splitmix64: the delays of one stream, reproducible from `CUDA_SIM_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// No delay half the time, else up to `max`, uniformly.
    fn delay(&mut self, max: Duration) -> Duration {
        let max = max.as_micros() as u64;
        if max == 0 || self.next().is_multiple_of(2) {
            return Duration::ZERO;
        }
        Duration::from_micros(self.next() % max)
    }
}
