//! The harness of the fault-injection tests on the simulated driver (`sim_faults.rs`, `sim_staged_peer.rs`):
//! [`each_call_fails`] runs a case once per driver call it makes, with that call failing.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cuda_pinned::{Context, Result, Stream};

use super::{LIMIT, Serial, bounded, sim};

/// Calls that release something: when one fails, its object stays.
const RELEASES: &[&str] = &[
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeHost",
    "cuMemHostUnregister",
    "cuStreamDestroy_v2",
    "cuEventDestroy_v2",
    "cuDevicePrimaryCtxRelease_v2",
    "cuModuleUnload",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// Calls that order work or find out whether it is done: when one fails before a release, the crate cannot
/// know that the memory is unused and leaks it on purpose (the rule "Release after completion").
const ORDERING: &[&str] = &[
    "cuEventCreate",
    "cuEventRecord",
    "cuStreamWaitEvent",
    "cuEventQuery",
    "cuStreamQuery",
    "cuEventSynchronize",
    "cuStreamSynchronize",
];

/// What must not leak: memory and streams. (Events may outlive a failed operation inside the trackers of
/// memory waiting in the deferred-release list until a later poll; they are not memory anyone relies on.)
fn memory(live: cuda_pinned_sim::Live) -> cuda_pinned_sim::Live {
    cuda_pinned_sim::Live { events: 0, ..live }
}

/// What each case starts from, made before the calls are counted: two streams of device 0, and one of
/// device 1.
pub struct Fixture {
    pub ctx: Context,
    pub a: Stream,
    pub b: Stream,
    pub ctx1: Context,
    pub c: Stream,
}

/// Runs `op` once to trace its driver calls, then once per call with that call failing. Returns how many
/// calls were failed.
///
/// The simulator must find nothing in a run without faults. With a fault injected, it must find no use of
/// freed memory and no hidden wait; a false dependency is allowed there: a failed enqueue is recorded as a use
/// that may have happened (the crate cannot know how much of it was queued), and a wait for it waits for
/// whatever came before on its stream.
pub fn each_call_fails(
    serial: &mut Serial,
    name: &str,
    op: impl Fn(&Fixture) -> Result<()>,
) -> usize {
    let sim = sim().expect("these tests run on the simulated driver");
    // The false dependencies allowed after a fault are taken below; anything else still fails the case.
    serial.expect_violations();
    let (ctx, ctx1) = (
        bounded!(Context::on(0)).unwrap(),
        bounded!(Context::on(1)).unwrap(),
    );
    let fixture = Fixture {
        a: bounded!(Stream::new(&ctx)).unwrap(),
        b: bounded!(Stream::new(&ctx)).unwrap(),
        c: bounded!(Stream::new(&ctx1)).unwrap(),
        ctx,
        ctx1,
    };
    let settle = |f: &Fixture| {
        sim.clear_faults();
        // Deferred releases run at a context synchronize once their work is done; a second pass catches
        // what the first one's completion queued.
        for ctx in [&f.ctx, &f.ctx1, &f.ctx, &f.ctx1] {
            let _ = bounded!(ctx.synchronize());
        }
        bounded!(f.ctx.check_deferred_errors()).and(bounded!(f.ctx1.check_deferred_errors()))
    };
    // The whole of one run of `op`: the calls in it are bounded one by one, but not the drops at its end.
    let run = |what: &str| bounded(what, LIMIT, || op(&fixture));
    let live = || bounded!(sim.live());
    // A first run makes what a context keeps for its whole life once used (its pooled events, its stream
    // for frees that wait for several streams), so that the baseline holds them.
    run(name).unwrap_or_else(|e| panic!("{name}: fails with no fault injected: {e}"));
    settle(&fixture).unwrap();
    let baseline = live();

    sim.trace_start();
    run(name).unwrap_or_else(|e| panic!("{name}: fails with no fault injected: {e}"));
    let calls = sim.trace_stop();
    settle(&fixture)
        .unwrap_or_else(|e| panic!("{name}: deferred error with no fault injected: {e}"));
    // Events are not compared: the context's pool keeps as many as were in use at once, which varies.
    assert_eq!(
        memory(live()),
        memory(baseline),
        "{name}: leaks with no fault injected"
    );
    assert!(!calls.is_empty(), "{name}: makes no driver call");

    // Each call of the trace, by function and occurrence (a call's global index can shift between runs, as
    // polls depend on timing; the n-th call of one function rarely does).
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    let mut swallowed = Vec::new();
    for function in &calls {
        let nth = {
            let n = seen.entry(function).or_default();
            *n += 1;
            *n
        };
        let what = format!("{name}: {function} #{nth} failing");
        assert_eq!(
            serial.take_violations(),
            Vec::<String>::new(),
            "{name}: before {what}"
        );
        let injected = sim.injected().len();
        // Each case is judged against what was live just before it, not before the first: memory an earlier
        // case leaked on purpose (a failed release, or a failed wait before one) stays leaked for good, and
        // would otherwise count against every case after it.
        let before = live();
        sim.fail(&format!("{function}:{nth}:CUDA_ERROR_UNKNOWN"))
            .unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| run(&what)));
        let deferred = settle(&fixture);
        let result = result.unwrap_or_else(|_| panic!("{what}: panicked"));
        let new: Vec<String> = serial
            .take_violations()
            .into_iter()
            .filter(|v| !v.starts_with("FALSE DEPENDENCY"))
            .collect();
        assert!(new.is_empty(), "{what}: the simulator found {new:?}");
        if sim.injected().len() == injected {
            continue; // this run made fewer such calls: nothing failed
        }
        match (&result, &deferred) {
            (Err(e), Ok(())) => {
                assert!(
                    e.to_string().contains("CUDA_ERROR_UNKNOWN"),
                    "{what}: the error lost its cause: {e}"
                );
                // A release the driver refused leaves its object behind: that is the driver's doing.
                if !RELEASES.contains(&function.as_str())
                    && !ORDERING.contains(&function.as_str())
                    && !e.to_string().contains("leaked")
                {
                    assert_eq!(
                        memory(live()),
                        memory(before),
                        "{what}: leaked after returning {e}"
                    );
                }
            }
            (_, Err(e)) => {
                // A destructor's call failed: reported here; the memory concerned may be leaked on purpose.
                assert!(
                    e.to_string().contains("CUDA_ERROR_UNKNOWN"),
                    "{what}: the error lost its cause: {e}"
                );
            }
            // Dropping the last handle of a context cannot report anything; a failed release leaves it retained.
            (Ok(()), Ok(())) if function == "cuDevicePrimaryCtxRelease_v2" => {}
            // `DeviceBuffer::from_raw` asks whether memory came from a pool; unanswered, it frees the memory with
            // cuMemFree once the device is idle, which is right for either kind.
            (Ok(()), Ok(())) if function == "cuPointerGetAttribute" => {}
            (Ok(()), Ok(())) => swallowed.push(what),
        }
    }
    assert!(swallowed.is_empty(), "no error came back: {swallowed:#?}");
    // The harness itself leaves nothing behind once its fixture is gone.
    bounded!(drop(fixture));
    calls.len()
}
