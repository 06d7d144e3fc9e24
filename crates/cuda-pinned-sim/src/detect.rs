//! Detectors of work that is right but costs time the crate promises not to spend: a *hidden wait* (a driver
//! call that synchronizes the whole device, made while unrelated work is queued) and a *false dependency* (a
//! stream made to wait for work that does not touch the memory its next operation uses). Each finding is a
//! violation, with the crate functions on the caller's stack, but no driver call fails for it: the work itself
//! is right.
//!
//! Hidden waits. On a real device (measured on an H100, driver 580, with a kernel running on another stream)
//! `cuMemFreeHost`, `cuMemHostUnregister` and `cuMemFree_v2` return only once all work queued on the device
//! has finished, and meanwhile hold back the driver calls of every other thread (a copy enqueued by another
//! thread waited as long): so such a call is a hidden wait on whichever thread it is made, the crate's own
//! included. `cuModuleUnload` is treated the same way. The simulator's calls wait the same way (`api/memory.rs`) and
//! report the call when the wait included work unrelated to what it releases (work that does not touch the
//! memory being released; work other than the launches of the module being unloaded), unless a crate
//! function on the stack documents that it waits for the device ([`documented_wait`]). `cuCtxSynchronize`, `cuStreamSynchronize` and
//! `cuEventSynchronize` wait on purpose for what they name: never reported.
//!
//! False dependencies. At `cuStreamWaitEvent(S, E)`, if E's record is still queued on another stream T, the
//! wait is for the last work ahead of the record on T (work: a copy, a memset, a host function, a kernel, a
//! stream-ordered allocation or free; records and waits take no time of their own). If there is none, the
//! wait costs nothing and is forgotten. Otherwise S remembers it, and S's next operation that touches memory
//! (a copy, a memset, a stream-ordered free, a kernel given pointers) is judged: each remembered work must
//! touch one of the allocations that operation touches (allocations, not byte ranges: the crate tracks whole
//! allocations, so two views of one buffer are one) if both come from the same call into the crate (see
//! `same_call`) on the same thread (another thread's operation on the stream is not what the wait was made
//! for). A kernel touches the allocations that contain the value of one of its 8-byte parameters at its
//! launch (the pointers it was given); a kernel given none, like a host function, next forgets them unjudged
//! (what it touches is unknown); a stream-ordered allocation next neither judges nor forgets them: it needs
//! no earlier work, the wait delays it no more than the operation after it, and a wait made for that later
//! operation is judged there. A host function *awaited* counts as touching no memory: it is how the tests
//! stand in for kernels, and those that stand in for kernels using memory end
//! with work on that memory (tests/common).
//!
//! Blocked executors. A thread that a test marks as an async executor's (`Control::executor_thread`) must never
//! wait in a driver call for queued device work: every call that would (a synchronization, a blocking copy, a
//! device-wide wait) and finds the work not done is reported there, with the crate functions on the stack, as
//! the crate's futures promise that awaiting device work never blocks the thread that polls them.

use std::backtrace::Backtrace;
use std::cell::Cell;

use crate::sim::{Dependency, Op, State};
use crate::stream;

/// The crate functions documented to wait for all work on the device before they return, so that a
/// device-wide wait inside them hides nothing: `Registered::into_vec` (the driver's unpinning synchronizes the
/// device, and it says so) and `Module::load` / `Module::load_binary` (loading a module waits for the device,
/// as they say).
const DOCUMENTED_WAITS: &[&str] = &["Registered<T>::into_vec", "Module::load"];

/// The crate functions documented to make a stream wait for more than the memory its next operation uses:
/// the prefetcher's refill of a slot (its worker threads' uploads) waits for everything its consumer enqueued
/// before giving the batch back (its own kernels included, which the crate cannot see), work on other batches
/// too.
const DOCUMENTED_DEPENDENCIES: &[&str] = &["prefetch::worker::"];

/// Whether a crate function on the stack (`callers`, from [`caller_frames`]) documents a device-wide wait.
pub(crate) fn documented_wait(callers: &[Frame]) -> bool {
    callers.iter().any(|f| {
        in_crate(&f.function)
            && DOCUMENTED_WAITS
                .iter()
                .any(|name| f.function.contains(name))
    })
}

// ---- hidden waits

/// What a call that synchronizes a device waits for: the operations queued on its streams when it is made.
pub(crate) struct DeviceSync {
    /// Each stream with queued work, and how many operations it will have finished once that work is done.
    targets: Vec<(usize, u64)>,
    /// Per stream (by handle), the queued work that does not touch the memory being released, described.
    unrelated: Vec<(usize, Vec<String>)>,
}

impl DeviceSync {
    /// What a call synchronizing `device` (every device where `None`) waits for now; `related` tells the
    /// queued operations that concern what the call releases (the users of the memory freed, reported
    /// otherwise as memory freed under queued work; the launches of the module unloaded), which it does not
    /// count as unrelated work. The stream whose host function makes the call, if one does, is left out: it
    /// cannot finish before the call returns.
    pub(crate) fn now(
        state: &State,
        device: Option<i32>,
        related: impl Fn(&Op) -> bool,
    ) -> DeviceSync {
        let own = stream::current_worker();
        let mut streams: Vec<_> = state
            .streams
            .iter()
            .filter(|(handle, s)| {
                device.is_none_or(|d| s.device == d) && Some(**handle) != own && !s.queue.is_empty()
            })
            .collect();
        streams.sort_by_key(|(handle, _)| **handle);
        let mut sync = DeviceSync {
            targets: Vec::new(),
            unrelated: Vec::new(),
        };
        for (&handle, s) in streams {
            let target = stream::finished(state, handle) + s.queue.len() as u64;
            sync.targets.push((handle, target));
            let work: Vec<String> = s
                .queue
                .iter()
                .filter(|op| op.is_work() && !related(op))
                .map(Op::describe)
                .collect();
            if !work.is_empty() {
                sync.unrelated.push((handle, work));
            }
        }
        sync
    }

    /// Whether every operation the call waits for has finished (streams destroyed since count as done).
    pub(crate) fn done(&self, state: &State) -> bool {
        self.targets
            .iter()
            .all(|&(handle, target)| stream::finished(state, handle) >= target)
    }

    /// The report of `function` waiting for unrelated work, without its caller; `None` where it waits for none.
    pub(crate) fn hidden_wait(&self, function: &str) -> Option<String> {
        if self.unrelated.is_empty() {
            return None;
        }
        let count: usize = self.unrelated.iter().map(|(_, work)| work.len()).sum();
        let streams: Vec<String> = self
            .unrelated
            .iter()
            .map(|(handle, work)| format!("{handle:#x} ({})", list(work, 3)))
            .collect();
        Some(format!(
            "HIDDEN WAIT: {function} waited for {count} queued operation{} on stream{} {}",
            if count == 1 { "" } else { "s" },
            if streams.len() == 1 { "" } else { "s" },
            streams.join(", ")
        ))
    }
}

/// The first `most` items, and how many more there are.
fn list(items: &[String], most: usize) -> String {
    let mut text = items[..items.len().min(most)].join(", ");
    if items.len() > most {
        text.push_str(&format!(" and {} more", items.len() - most));
    }
    text
}

// ---- false dependencies

/// The work that a stream (`waiter`) made to wait now for record `generation` of `event` depends on: the last
/// work ahead of that record, if the record is still queued on another stream behind work.
pub(crate) fn awaited(
    state: &State,
    waiter: usize,
    event: usize,
    generation: u64,
) -> Option<Dependency> {
    let e = state.events.get(&event)?;
    if !e.pending.contains(&generation) {
        return None;
    }
    let is_the_record = |op: &Op| matches!(*op, Op::Record { event: ev, generation: g } if ev == event && g == generation);
    let (&handle, stream) = state
        .streams
        .iter()
        .find(|(_, s)| s.queue.iter().any(is_the_record))?;
    if handle == waiter {
        // Stream order covers it: the wait costs nothing.
        return None;
    }
    let at = stream.queue.iter().position(is_the_record)?;
    let work = stream.queue.iter().take(at).rev().find(|op| op.is_work())?;
    Some(Dependency {
        stream: handle,
        work: describe(state, work),
        allocations: work.footprint(),
        // Unwinding only: the frames are named if the wait is ever reported.
        waited_from: Backtrace::force_capture(),
        thread: std::thread::current().id(),
    })
}

/// A false dependency found, to be reported once the callers are named (without the simulator's lock).
pub(crate) struct FalseDependency {
    report: String,
    waited_from: Backtrace,
}

impl FalseDependency {
    /// The report, with the callers of the wait and of the operation judged (`op_caller`, from
    /// [`caller_frames`]); `None` where the two come from different calls into the crate (see
    /// [`same_call`]): then the operation is not what the wait was made for.
    pub(crate) fn report(self, op_caller: &[Frame]) -> Option<String> {
        let waited_from = callers(&frames(&self.waited_from.to_string()));
        if !same_call(&waited_from, op_caller) {
            return None;
        }
        let documented = |f: &Frame| {
            in_crate(&f.function)
                && DOCUMENTED_DEPENDENCIES
                    .iter()
                    .any(|name| f.function.contains(name))
        };
        if waited_from.iter().any(documented) {
            return None;
        }
        Some(format!(
            "{}; the wait was {}; the operation was {}",
            self.report,
            describe_callers(&waited_from),
            describe_callers(op_caller)
        ))
    }
}

/// Judges `op`, about to be queued on stream `handle`, against the work the stream was made to wait for since
/// its last operation that touches memory, and forgets that work where `op` touches memory or may (a host
/// function, a kernel given no pointers). What it finds, to be reported with [`FalseDependency::report`].
pub(crate) fn judge(state: &mut State, handle: usize, op: &Op) -> Vec<FalseDependency> {
    let thread = std::thread::current().id();
    let Some(stream) = state.streams.get_mut(&handle) else {
        return Vec::new();
    };
    match op {
        Op::Record { .. } | Op::Wait { .. } | Op::Allocate { .. } => return Vec::new(),
        Op::Host(_) => {
            stream.depends.retain(|d| d.thread != thread);
            return Vec::new();
        }
        Op::Kernel(launch) if launch.allocations.is_empty() => {
            stream.depends.retain(|d| d.thread != thread);
            return Vec::new();
        }
        Op::Copy { .. } | Op::Set { .. } | Op::Free { .. } | Op::Kernel(_) | Op::Graph(_) => {}
    }
    // Waits other threads made on this stream are for their own operations, judged when those come.
    let (depends, others) = std::mem::take(&mut stream.depends)
        .into_iter()
        .partition(|d| d.thread == thread);
    stream.depends = others;
    let uses = op.footprint();
    let mut found: Vec<FalseDependency> = Vec::new();
    for d in depends {
        if d.allocations.iter().any(|a| uses.contains(a)) {
            continue;
        }
        let report = format!(
            "FALSE DEPENDENCY: stream {handle:#x} waited for {} on stream {:#x}, which touches none of {} that {} \
             uses",
            d.work,
            d.stream,
            memory(state, &uses),
            op.describe()
        );
        if !found.iter().any(|f| f.report == report) {
            found.push(FalseDependency {
                report,
                waited_from: d.waited_from,
            });
        }
    }
    found
}

/// `op` and the memory it touches, by kind and address.
fn describe(state: &State, op: &Op) -> String {
    let footprint = op.footprint();
    if footprint.is_empty() {
        return op.describe();
    }
    format!("{} ({})", op.describe(), memory(state, &footprint))
}

/// Allocations by kind and address.
fn memory(state: &State, ids: &[u64]) -> String {
    if ids.is_empty() {
        return "the memory (pageable host memory only)".into();
    }
    let mut names: Vec<String> = Vec::new();
    for id in ids {
        let name = match state.allocations.get(id) {
            Some(a) => format!("{} {:#x}", a.kind.describe(), a.base),
            None => format!("released memory (allocation {id})"),
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names.join(", ")
}

// ---- the caller

/// The frames of the calling thread's callers, innermost first (see [`callers`]), for [`describe_callers`]
/// and [`FalseDependency::report`]. As slow as [`caller`].
pub(crate) fn caller_frames() -> Vec<Frame> {
    callers(&frames(&Backtrace::force_capture().to_string()))
}

/// One frame of a backtrace: the function and, where known, its place.
#[derive(Debug, PartialEq)]
pub(crate) struct Frame {
    function: String,
    at: Option<String>,
}

/// The frames of a backtrace as `std::backtrace::Backtrace` prints them, innermost first: a numbered line per
/// frame (and an unnumbered one per function inlined into it), each followed by an `at file:line:column` line
/// where the place is known.
fn frames(text: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(place) = line.strip_prefix("at ") {
            if let Some(last) = frames.last_mut()
                && last.at.is_none()
            {
                last.at = Some(short_place(place));
            }
            continue;
        }
        let function = match line.split_once(": ") {
            Some((number, rest)) if number.chars().all(|c| c.is_ascii_digit()) => rest,
            _ => line,
        };
        frames.push(Frame {
            function: function.to_owned(),
            at: None,
        });
    }
    frames
}

/// `src/memory/pinned.rs:262` for `/path/to/checkout/src/memory/pinned.rs:262:13`.
fn short_place(place: &str) -> String {
    let start = ["/src/", "/tests/", "/examples/"]
        .iter()
        .filter_map(|dir| place.rfind(dir))
        .max()
        .map_or(0, |i| i + 1);
    let place = &place[start..];
    // Drop the column.
    match place.rsplit_once(':') {
        Some((file_line, column))
            if file_line.contains(':') && column.chars().all(|c| c.is_ascii_digit()) =>
        {
            file_line.to_owned()
        }
        _ => place.to_owned(),
    }
}

/// A function of the crate under test (not of the simulator, whose crate name only starts the same).
fn in_crate(function: &str) -> bool {
    function
        .trim_start_matches('<')
        .starts_with("cuda_pinned::")
}

/// A function of the simulator, of the standard library, or of the C runtime: never the caller.
fn in_runtime(function: &str) -> bool {
    let function = function.trim_start_matches('<');
    !function.contains("::")
        || [
            "cuda_pinned_sim::",
            "cuda_pinned_sys::",
            "std::",
            "core::",
            "alloc::",
            "test::",
            "__",
        ]
        .iter()
        .any(|prefix| function.starts_with(prefix))
}

/// Whether `inner` is a closure (or a closure of a closure ...) of `outer`.
fn is_closure_of(inner: &str, outer: &str) -> bool {
    let Some(mut rest) = inner.strip_prefix(outer) else {
        return false;
    };
    if rest.is_empty() {
        return false;
    }
    while let Some(after) = rest
        .strip_prefix("::{{closure}}")
        .or_else(|| rest.strip_prefix("::{closure#0}"))
    {
        rest = after;
    }
    rest.is_empty()
}

/// A function's name as a reader wants it: `cuda_pinned::copy::Stream::copy` for
/// `cuda_pinned::copy::<impl cuda_pinned::stream::Stream>::copy`, `{closure}` for `{{closure}}`.
fn readable(function: &str) -> String {
    let mut out = String::with_capacity(function.len());
    let mut rest = function;
    while let Some(at) = rest.find("<impl ") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "<impl ".len()..];
        // The matching `>`, past any generic arguments of the type.
        let mut depth = 1;
        let end = after.char_indices().find_map(|(i, c)| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        });
        let Some(end) = end else {
            out.push_str(&rest[at..]);
            rest = "";
            break;
        };
        let path = &after[..end];
        let path = path.split('<').next().unwrap_or(path);
        out.push_str(path.rsplit("::").next().unwrap_or(path));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out.replace("{{closure}}", "{closure}")
}

/// The callers' frames, innermost first: the frames outside the simulator and the standard library, a closure
/// merged into the function (or closure) that called it, with the place of the caller (a closure's place can
/// be inside a macro, such as `driver_call!`).
fn callers(frames: &[Frame]) -> Vec<Frame> {
    let mut callers: Vec<Frame> = Vec::new();
    for frame in frames.iter().filter(|f| !in_runtime(&f.function)) {
        match callers.last_mut() {
            Some(last) if is_closure_of(&last.function, &frame.function) => {
                last.function.clone_from(&frame.function);
                if frame.at.is_some() {
                    last.at.clone_from(&frame.at);
                }
            }
            _ => callers.push(Frame {
                function: frame.function.clone(),
                at: frame.at.clone(),
            }),
        }
    }
    callers
}

/// Whether a wait and an operation come from one call into the crate: the same outermost crate frame (the
/// API called, and the line in it that led to the driver call) called from the same place; or both from raw
/// driver calls, which the simulator judges as it sees them. The crate makes the waits an operation needs in
/// the call that enqueues it; a wait made by one call and followed by an operation of another (a user's own
/// `Stream::wait`, the prefetcher's hand-over of a batch, which readies the stream for whatever the consumer
/// enqueues, raw kernels included) is not made for that operation, and is not judged by it.
///
/// Where a side shows no crate frame, it counts as a raw driver call only if every one of its frames is named
/// with its path: with line tables alone (`debug = "line-tables-only"`, as cargo-fuzz builds), an inlined
/// function is named without its module (`and_then<..>`, `{closure#0}<..>`), so a call through the crate can
/// look like a raw one. Such a wait is not judged: a false dependency is reported only when it is known.
fn same_call(wait: &[Frame], op: &[Frame]) -> bool {
    fn entry(callers: &[Frame]) -> Option<(&Frame, Option<&Frame>)> {
        let at = callers.iter().rposition(|f| in_crate(&f.function))?;
        Some((&callers[at], callers.get(at + 1)))
    }
    match (entry(wait), entry(op)) {
        (Some(wait), Some(op)) => wait == op,
        (None, None) => wait.iter().chain(op).all(|f| has_path(&f.function)),
        _ => false,
    }
}

/// Whether a function is named with its path (`module::function`, `<Type as Trait>::function`), not only its
/// own name and generic arguments.
fn has_path(function: &str) -> bool {
    let function = function.trim_start_matches('<');
    function
        .split('<')
        .next()
        .is_some_and(|head| head.contains("::"))
}

/// "called from" the crate functions among `callers`, outermost first (a few), or the nearest caller where
/// none is the crate's.
pub(crate) fn describe_callers(callers: &[Frame]) -> String {
    let name = |f: &Frame| match &f.at {
        Some(at) => format!("{} ({at})", readable(&f.function)),
        None => readable(&f.function),
    };
    let mut ours: Vec<&Frame> = callers.iter().filter(|f| in_crate(&f.function)).collect();
    if !ours.is_empty() {
        ours.reverse();
        let shown: Vec<String> = if ours.len() > 4 {
            let mut shown: Vec<String> = ours[..3].iter().map(|f| name(f)).collect();
            shown.push("...".into());
            shown.push(name(ours[ours.len() - 1]));
            shown
        } else {
            ours.iter().map(|f| name(f)).collect()
        };
        return format!("called from {}", shown.join(" -> "));
    }
    match callers.first() {
        Some(frame) => format!("called from {}, not through cuda_pinned", name(frame)),
        None => "called from an unknown place (this build has no symbols to name it)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `std::backtrace::Backtrace` prints a call from a crate function through `driver_call!`.
    const THROUGH_THE_CRATE: &str = "   0: cuda_pinned_sim::detect::caller
             at ./crates/cuda-pinned-sim/src/detect.rs:10:5
   1: cuda_pinned_sim::api::memory::free_now
             at ./crates/cuda-pinned-sim/src/api/memory.rs:200:9
   2: cuMemFreeHost
             at ./crates/cuda-pinned-sim/src/api/host.rs:700:5
   3: cuda_pinned::memory::pinned::Pinned<T>::drop::{{closure}}::{{closure}}
             at /home/dev/cuda-pinned/src/memory/pinned.rs:262:22
   4: core::result::Result<T,E>::and_then
             at /rustc/abc/library/core/src/result.rs:1300:22
   5: cuda_pinned::memory::pinned::Pinned<T>::drop::{{closure}}
             at /home/dev/cuda-pinned/src/memory/pinned.rs:263:22
   6: cuda_pinned::memory::release::run
             at /home/dev/cuda-pinned/src/memory/release.rs:98:30
   7: cuda_pinned::memory::release::release_host
             at /home/dev/cuda-pinned/src/memory/release.rs:44:21
   8: <cuda_pinned::memory::pinned::Pinned<T> as core::ops::drop::Drop>::drop
             at /home/dev/cuda-pinned/src/memory/pinned.rs:264:9
   9: core::ptr::drop_in_place<cuda_pinned::memory::pinned::Pinned<u32>>
             at /rustc/abc/library/core/src/ptr/mod.rs:805:1
  10: gpu_copies::copies_between_streams
             at ./tests/gpu_copies.rs:40:5
  11: core::ops::function::FnOnce::call_once
             at /rustc/abc/library/core/src/ops/function.rs:250:5
";

    #[test]
    fn crate_frames_outermost_first() {
        assert_eq!(
            describe_callers(&callers(&frames(THROUGH_THE_CRATE))),
            "called from <cuda_pinned::memory::pinned::Pinned<T> as core::ops::drop::Drop>::drop \
             (src/memory/pinned.rs:264) -> cuda_pinned::memory::release::release_host (src/memory/release.rs:44) \
             -> cuda_pinned::memory::release::run (src/memory/release.rs:98) -> \
             cuda_pinned::memory::pinned::Pinned<T>::drop::{closure} (src/memory/pinned.rs:263)"
        );
    }

    #[test]
    fn a_raw_call_names_its_caller() {
        let text = "   0: cuda_pinned_sim::detect::caller
             at ./crates/cuda-pinned-sim/src/detect.rs:10:5
   1: cuMemFreeHost
   2: sim_detectors::hidden_wait::{{closure}}
             at ./crates/cuda-pinned/src/lib.rs:122:13
   3: core::result::Result<T,E>::and_then
   4: sim_detectors::hidden_wait
             at ./tests/sim_detectors.rs:50:9
";
        assert_eq!(
            describe_callers(&callers(&frames(text))),
            "called from sim_detectors::hidden_wait (tests/sim_detectors.rs:50), not through cuda_pinned"
        );
    }

    #[test]
    fn readable_names() {
        assert_eq!(
            readable("cuda_pinned::copy::<impl cuda_pinned::stream::Stream>::copy::{{closure}}"),
            "cuda_pinned::copy::Stream::copy::{closure}"
        );
        assert_eq!(
            readable("cuda_pinned::a::<impl cuda_pinned::b::Buffer<Vec<T>>>::f"),
            "cuda_pinned::a::Buffer::f"
        );
        assert_eq!(readable("<a::B as c::D>::e"), "<a::B as c::D>::e");
    }

    #[test]
    fn a_wait_is_judged_by_an_operation_of_the_same_call() {
        let stack = |inner: &str, caller: &str| {
            let text = format!(
                "   0: cuda_pinned_sim::detect::caller\n   1: {inner}\n             at /x/src/copy.rs:440:9\n   \
                 2: cuda_pinned::copy::Stream::copy\n             at /x/src/copy.rs:270:9\n   3: {caller}\n"
            );
            callers(&frames(&text))
        };
        let copy_at = |line: u32| format!("user::main\n             at ./src/main.rs:{line}:5");
        let prepare = stack("cuda_pinned::track::Tracker<S,E>::prepare", &copy_at(10));
        let enqueue = stack("cuda_pinned::copy::Stream::tracked_as", &copy_at(10));
        assert!(same_call(&prepare, &enqueue));
        // The next copy of the program, from another line.
        let next = stack("cuda_pinned::copy::Stream::tracked_as", &copy_at(11));
        assert!(!same_call(&prepare, &next));
        // A user's own wait, then a copy.
        let wait = callers(&frames(
            "   0: cuStreamWaitEvent\n   1: cuda_pinned::stream::Stream::wait\n             at /x/src/stream.rs:150:9\n   \
             2: user::main\n             at ./src/main.rs:9:5\n",
        ));
        assert!(!same_call(&wait, &enqueue));
        // Raw calls on both sides.
        let raw = |line: u32| {
            callers(&frames(&format!(
                "   0: cuStreamWaitEvent\n   1: user::main\n             at ./src/main.rs:{line}:5\n"
            )))
        };
        assert!(same_call(&raw(3), &raw(4)));
        // A build with line tables only: the crate's functions inlined into the caller are named without
        // their module, so the wait's call cannot be told from the copy's, and is not judged.
        let unnamed = callers(&frames(
            "   0: cuStreamWaitEvent\n   1: and_then<&cuda_pinned::sys::load::Driver, cuda_pinned::error::Error>\n   \
             2: user::main\n             at ./src/main.rs:9:5\n",
        ));
        assert!(!same_call(&unnamed, &raw(4)));
        assert!(!same_call(&unnamed, &enqueue));
    }

    #[test]
    fn no_symbols() {
        let text = "   0: <unknown>\n   1: <unknown>\n";
        assert!(describe_callers(&callers(&frames(text))).contains("no symbols"));
    }

    #[test]
    fn long_stacks_keep_the_outermost_and_the_innermost() {
        let text: String = (0..6)
            .map(|i| format!("  {i}: cuda_pinned::f{i}\n             at /x/src/a.rs:{i}:1\n"))
            .collect();
        assert_eq!(
            describe_callers(&callers(&frames(&text))),
            "called from cuda_pinned::f5 (src/a.rs:5) -> cuda_pinned::f4 (src/a.rs:4) -> cuda_pinned::f3 \
             (src/a.rs:3) -> ... -> cuda_pinned::f0 (src/a.rs:0)"
        );
    }

    #[test]
    fn inlined_functions_count() {
        let text = "   0: cuda_pinned_sim::api::memory::free_now\n      cuda_pinned::inlined\n             at /x/src/b.rs:7:2\n";
        assert_eq!(
            frames(text),
            vec![
                Frame {
                    function: "cuda_pinned_sim::api::memory::free_now".into(),
                    at: None
                },
                Frame {
                    function: "cuda_pinned::inlined".into(),
                    at: Some("src/b.rs:7".into())
                },
            ]
        );
    }
}

// ---- blocked executors

thread_local! {
    /// Whether the calling thread is marked as an async executor's.
    static EXECUTOR: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as an async executor's (or not).
pub(crate) fn set_executor_thread(on: bool) {
    EXECUTOR.set(on);
}

/// Whether the calling thread is marked as an async executor's.
pub(crate) fn on_executor_thread() -> bool {
    EXECUTOR.get()
}

/// The report of a driver call that is about to wait for queued work on an executor's thread, `callers` its
/// stack.
pub(crate) fn blocked_executor(callers: &[Frame]) -> String {
    format!(
        "BLOCKED EXECUTOR: a driver call waited for queued device work on a thread of an async executor; {}",
        describe_callers(callers)
    )
}
