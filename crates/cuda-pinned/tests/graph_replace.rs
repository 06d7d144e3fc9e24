//! `Graph::replace`: a graph's launches moved from one buffer to another through its nodes (copies, kernel
//! parameters). Launches from then on use the new buffer, launches queued before keep the old one, which the
//! graph lets go of (its owner's again, after those launches); and what the crate cannot move is refused with
//! nothing changed. Each rule beside a control that breaks it.
//!
//! On a GPU (feature `gpu`) the kernels are `cuda/test_kernels.cu`; on the simulated driver (two devices) Rust
//! stand-ins of the same names, and a launch queued before a node changes keeps the parameters it was queued
//! with, as the driver's does.

mod common;

use std::time::Duration;

use common::{data, hold, serial_on_two_devices};
use cuda_pinned::{
    Arg, Context, DeviceBuffer, Graph, Kernel, LaunchConfig, Pinned, PinnedBuilder, Stream, Use,
};

const N: usize = 1 << 12;

fn context() -> Context {
    common::device(0)
}

fn add_kernel(context: &Context) -> Kernel {
    common::test_kernels(context)
        .unwrap()
        .kernel("add_u32")
        .unwrap()
}

fn plus(values: &[u32], n: u32) -> Vec<u32> {
    values.iter().map(|v| v.wrapping_add(n)).collect()
}

/// A step: `input` uploaded into `x` on `a`, `y = x + 1` on `a`, `y` downloaded into `output` on `b`.
struct Step {
    input: Pinned<u32>,
    x: DeviceBuffer<u32>,
    y: DeviceBuffer<u32>,
    output: Pinned<u32>,
}

impl Step {
    fn new(ctx: &Context, a: &Stream, seed: u64) -> Step {
        Step {
            input: Pinned::from_slice(ctx, &data(N, seed)).unwrap(),
            x: DeviceBuffer::zeroed(a, N).unwrap(),
            y: DeviceBuffer::zeroed(a, N).unwrap(),
            output: Pinned::zeroed(ctx, N).unwrap(),
        }
    }

    fn capture(&mut self, kernel: &Kernel, a: &Stream, b: &Stream) -> Graph {
        Graph::capture(&[a, b], || {
            a.upload(&self.input, &mut self.x)?;
            let n = u32::try_from(N).unwrap();
            // SAFETY: add_u32(const unsigned*, unsigned*, unsigned, unsigned) reads x[..n], writes y[..n].
            unsafe {
                a.launch(
                    kernel,
                    LaunchConfig::for_elements(N, 256).unwrap(),
                    &[
                        Arg::read(&self.x),
                        Arg::write(&mut self.y),
                        Arg::value(&1u32),
                        Arg::value(&n),
                    ],
                )
            }?;
            b.download(&self.y, &mut self.output)
        })
        .unwrap()
    }
}

/// Expects an invalid-argument error from `Graph::replace` saying `says`, with nothing changed.
fn refused(result: cuda_pinned::Result<()>, says: &str) {
    match result {
        Err(e @ cuda_pinned::Error::InvalidArgument { .. }) => {
            let text = e.to_string();
            assert!(text.contains(says), "{text:?} does not say {says:?}");
            assert!(text.contains("nothing was changed"), "{text:?}");
        }
        other => panic!("expected an invalid-argument error saying {says:?}, got {other:?}"),
    }
}

/// Every buffer of the step replaced (the copy's host source, the kernel's parameters, the download's
/// destination): the next launch reads and writes only the new ones, and the old ones are their owners'
/// again, untouched.
#[test]
fn launches_after_a_replace_use_the_new_buffers_only() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel = add_kernel(&ctx);
    let mut step = Step::new(&ctx, &a, 1);
    let mut graph = step.capture(&kernel, &a, &b);
    graph.launch(&a).unwrap();
    let first = graph.host_slice(&step.output).unwrap().to_vec();
    assert_eq!(first, plus(&data(N, 1), 1));

    let mut other = Step::new(&ctx, &a, 2);
    graph.replace(&step.input, &mut other.input).unwrap();
    graph.replace(&step.x, &mut other.x).unwrap();
    graph.replace(&step.y, &mut other.y).unwrap();
    graph.replace(&step.output, &mut other.output).unwrap();
    assert_eq!(graph.buffers(), 4);
    graph.launch(&b).unwrap();
    assert_eq!(
        graph.host_slice(&other.output).unwrap(),
        &plus(&data(N, 2), 1)[..],
        "the launch after the replace did not read the new input"
    );
    // The old buffers are the step's again: their own accessors lend them, as the first launch left them.
    assert_eq!(step.output.as_slice().unwrap(), &first[..]);
    assert_eq!(step.input.as_slice().unwrap(), &data(N, 1)[..]);
    let mut back = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    a.download(&step.y, &mut back).unwrap();
    assert_eq!(back.as_slice().unwrap(), &first[..]);
    // And replaced back, the graph runs on them once more.
    step.input.as_mut_slice().unwrap().fill(7);
    graph.replace(&other.input, &mut step.input).unwrap();
    graph.replace(&other.output, &mut step.output).unwrap();
    graph.launch(&a).unwrap();
    assert!(
        graph
            .host_slice(&step.output)
            .unwrap()
            .iter()
            .all(|&v| v == 8)
    );
    drop(graph);
    assert!(
        other
            .output
            .as_slice()
            .unwrap()
            .iter()
            .eq(plus(&data(N, 2), 1).iter())
    );
}

/// Host memory of another device's context replaces the step's input and output: page-locked memory serves
/// every context's copies (under unified addressing, whatever the portable flag says), so the graph's copies
/// move to it and the launches read and write it. Where the machine has one device, there is nothing to show.
#[test]
fn host_buffers_of_another_context_replace_the_graphs_own() {
    let _serial = serial_on_two_devices();
    if common::device_count() < 2 {
        return;
    }
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel = add_kernel(&ctx);
    let mut step = Step::new(&ctx, &a, 4);
    let mut graph = step.capture(&kernel, &a, &b);
    let other = common::device(1);
    for portable in [true, false] {
        let build = || PinnedBuilder::new(&other).portable(portable);
        let mut input = build().from_slice(&data(N, 5)).unwrap();
        let mut output = build().zeroed::<u32>(N).unwrap();
        graph.replace(&step.input, &mut input).unwrap();
        graph.replace(&step.output, &mut output).unwrap();
        graph.launch(&a).unwrap();
        assert_eq!(
            graph.host_slice(&output).unwrap(),
            &plus(&data(N, 5), 1)[..],
            "the launch after a replace by host memory of another context (portable: {portable})"
        );
        graph.replace(&input, &mut step.input).unwrap();
        graph.replace(&output, &mut step.output).unwrap();
    }
    graph.launch(&a).unwrap();
    assert_eq!(
        graph.host_slice(&step.output).unwrap(),
        &plus(&data(N, 4), 1)[..]
    );
}

/// A launch queued behind a held stream, then the step's output replaced by a new buffer and the graph
/// launched again, all before the hold is released; `read` reads the old output right then. Returns what it
/// read, with the old output and the new one once everything has run.
fn replace_the_output_behind_a_launch(
    read: impl FnOnce(&Pinned<u32>) -> Vec<u32>,
) -> [Vec<u32>; 3] {
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel = add_kernel(&ctx);
    let mut step = Step::new(&ctx, &a, 3);
    let mut graph = step.capture(&kernel, &a, &b);
    let mut next = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    let early = {
        let _held = hold(&a, Duration::from_millis(300));
        graph.launch(&a).unwrap();
        graph.replace(&step.output, &mut next).unwrap();
        graph.launch(&a).unwrap();
        read(&step.output)
    };
    let old = step.output.as_slice().unwrap().to_vec();
    let new = graph.host_slice(&next).unwrap().to_vec();
    [early, old, new]
}

/// Double buffering: a launch queued before the replace (behind a busy stream) still writes the old output,
/// and the old output's own accessor waits for it; the launch after writes the new one.
#[test]
fn a_launch_queued_before_a_replace_keeps_the_old_buffers() {
    let _serial = serial_on_two_devices();
    let want = plus(&data(N, 3), 1);
    let [_, old, new] = replace_the_output_behind_a_launch(|_| Vec::new());
    assert_eq!(
        old, want,
        "the old output was lent before the launch queued before the replace wrote it"
    );
    assert_eq!(new, want);
}

/// The control: the old output read through the raw pointer, without the wait its accessor makes, is read
/// before the launch queued behind the hold has written it (on the simulated driver, where the hold is a host
/// function that blocks the stream until the value drops).
#[cfg(not(feature = "gpu"))]
#[test]
fn control_the_old_output_read_without_the_wait_is_read_too_early() {
    let _serial = serial_on_two_devices();
    let [early, ..] = replace_the_output_behind_a_launch(|output| {
        // SAFETY: the memory is allocated and its elements initialised (zeroed); the read races the launch
        // on purpose, which the hold keeps from running.
        unsafe { std::slice::from_raw_parts(output.as_ptr(), N) }.to_vec()
    });
    assert!(
        early.iter().all(|&v| v == 0),
        "the launch ran before the hold was released"
    );
}

/// What `Graph::replace` refuses, with nothing changed: the graph still runs on its buffers afterwards.
#[test]
fn replace_refuses_what_it_cannot_move() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel = add_kernel(&ctx);
    let mut step = Step::new(&ctx, &a, 4);
    let mut graph = step.capture(&kernel, &a, &b);
    let stranger = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    let mut short = Pinned::<u32>::zeroed(&ctx, N / 2).unwrap();
    refused(graph.replace(&stranger, &mut step.input), "does not use");
    refused(
        graph.replace(&step.input, &mut step.output),
        "uses the new buffer already",
    );
    refused(graph.replace(&step.input, &mut short), "same length");
    let far = common::device(1);
    let far_stream = Stream::new(&far).unwrap();
    let mut elsewhere = DeviceBuffer::<u32>::zeroed(&far_stream, N).unwrap();
    refused(graph.replace(&step.x, &mut elsewhere), "another context");

    // A host buffer another graph holds: it lends it to the host, so it belongs to that graph alone.
    let mut held = Step::new(&ctx, &a, 5);
    let other = held.capture(&kernel, &a, &b);
    refused(
        graph.replace(&step.input, &mut held.input),
        "another graph holds",
    );

    // A buffer used by declared foreign work: where that work keeps its address is not the crate's to see.
    let mut foreign_out = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let address = foreign_out.as_raw();
    let mut foreign = Graph::capture(&[&a], || {
        // SAFETY: the work writes only `foreign_out`, all of it, on the stream it is given.
        unsafe {
            a.enqueue_foreign(&[Use::write(&mut foreign_out)], |raw| {
                cuda_pinned::driver_call!(cuMemsetD8Async(address, 1, N * 4, raw))
            })
        }?
    })
    .unwrap();
    let mut spare = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    refused(foreign.replace(&foreign_out, &mut spare), "foreign work");
    foreign.launch(&a).unwrap();

    graph.launch(&a).unwrap();
    assert_eq!(
        graph.host_slice(&step.output).unwrap(),
        &plus(&data(N, 4), 1)[..],
        "a refused replace changed the graph"
    );
    drop((other, foreign));
}

/// A change the driver refuses half-way (simulated faults on the second node's update) is undone: the graph
/// runs on its old buffers, and the new one is not held.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_replace_the_driver_refuses_half_way_is_undone() {
    let _serial = serial_on_two_devices();
    let sim = common::sim().unwrap();
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel = add_kernel(&ctx);
    let mut step = Step::new(&ctx, &a, 6);
    let mut graph = step.capture(&kernel, &a, &b);
    // `y` is used by the kernel node and the download's copy node: the copy's update fails.
    let mut y2 = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    sim.fail("cuGraphExecMemcpyNodeSetParams:1:CUDA_ERROR_UNKNOWN")
        .unwrap();
    let replaced = graph.replace(&step.y, &mut y2);
    sim.clear_faults();
    assert!(replaced.is_err(), "{replaced:?}");
    graph.launch(&a).unwrap();
    assert_eq!(
        graph.host_slice(&step.output).unwrap(),
        &plus(&data(N, 6), 1)[..]
    );
    // Not held: dropping it while the graph lives frees it at once, and the launches do not touch it.
    drop(y2);
    graph.launch(&b).unwrap();
    assert_eq!(
        graph.host_slice(&step.output).unwrap(),
        &plus(&data(N, 6), 1)[..]
    );
}

/// Runs the step with `x` replaced by a buffer that eager work on another stream (held busy) writes just
/// before, through `launch`; returns what that buffer holds at the end.
fn launch_after_an_eager_write_to_the_new_buffer(
    launch: impl FnOnce(&mut Graph, &Stream),
) -> Vec<u32> {
    let ctx = context();
    let (a, b, c) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let kernel = add_kernel(&ctx);
    let mut step = Step::new(&ctx, &a, 8);
    let mut graph = step.capture(&kernel, &a, &b);
    let mut x2 = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let eager = Pinned::from_slice(&ctx, &data(N, 9)).unwrap();
    ctx.synchronize().unwrap();
    // A launch before, on the same stream.
    graph.launch(&a).unwrap();
    {
        let _held = hold(&c, Duration::from_millis(300));
        c.upload(&eager, &mut x2).unwrap();
        graph.replace(&step.x, &mut x2).unwrap();
        launch(&mut graph, &a);
    }
    ctx.synchronize().unwrap();
    let mut back = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    a.download(&x2, &mut back).unwrap();
    back.as_slice().unwrap().to_vec()
}

/// The launch after a replace waits for eager work on the new buffer: the graph's upload into it lands last.
#[test]
fn the_launch_after_a_replace_waits_for_eager_work_on_the_new_buffer() {
    let _serial = serial_on_two_devices();
    let got = launch_after_an_eager_write_to_the_new_buffer(|graph, a| {
        graph.launch(a).unwrap();
    });
    assert_eq!(
        got,
        data(N, 8),
        "the eager write landed after the launch's upload"
    );
}

/// The control: launched through the raw handle, untracked, the launch runs at once (its stream is waited
/// for while the other is held), and the eager write lands after it (on the simulated driver, where the hold
/// blocks its stream until released).
#[cfg(not(feature = "gpu"))]
#[test]
fn control_an_untracked_launch_after_a_replace_is_overwritten_by_the_eager_work() {
    let _serial = serial_on_two_devices();
    let got = launch_after_an_eager_write_to_the_new_buffer(|graph, a| {
        // SAFETY: a live executable graph and stream; the buffers outlive the launch (synchronized after).
        unsafe { cuda_pinned::driver_call!(cuGraphLaunch(graph.as_raw(), a.as_raw())) }.unwrap();
        a.synchronize().unwrap();
    });
    assert_eq!(
        got,
        data(N, 9),
        "the untracked launch waited for the eager write"
    );
}

/// Registers, on the simulated driver, `fill_to_end(unsigned* begin, unsigned long long end, unsigned value)`:
/// writes `value` to every element of `[begin, end)`, an end pointer passed by value as C++ ranges pass it.
#[cfg(not(feature = "gpu"))]
fn fill_to_end(context: &Context) -> Kernel {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        common::sim()
            .unwrap()
            .register_kernel("fill_to_end", &[8, 8, 4], |call| {
                let (begin, end, value) =
                    (call.arg::<u64>(0), call.arg::<u64>(1), call.arg::<u32>(2));
                let n = (end.saturating_sub(begin) / 4) as usize;
                call.write(begin, &vec![value; n]);
            })
            .unwrap();
    });
    cuda_pinned::Module::load(context, b"// fill_to_end stand-in\n")
        .unwrap()
        .kernel("fill_to_end")
        .unwrap()
}

/// An end pointer passed by value (the address just past the buffer) moves with the buffer: the kernel fills
/// the new buffer, all of it and nothing past it (the simulated driver reports a write out of bounds). A
/// pointer to another buffer that starts there, passed as memory, does not move: the other tests, on a GPU
/// whose allocations lie end to end.
#[cfg(not(feature = "gpu"))]
#[test]
fn an_end_pointer_passed_by_value_moves_with_the_buffer() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let a = Stream::new(&ctx).unwrap();
    let kernel = fill_to_end(&ctx);
    let mut y = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let end = y.as_raw() + (N * 4) as u64;
    let mut graph = Graph::capture(&[&a], || {
        // SAFETY: fill_to_end(unsigned*, unsigned long long, unsigned) writes exactly y[..N] (end = y + N).
        unsafe {
            a.launch(
                &kernel,
                LaunchConfig::new(1, 1),
                &[Arg::write(&mut y), Arg::value(&end), Arg::value(&7u32)],
            )
        }
    })
    .unwrap();
    let mut y2 = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    graph.replace(&y, &mut y2).unwrap();
    drop(y);
    graph.launch(&a).unwrap();
    let mut back = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    a.download(&y2, &mut back).unwrap();
    assert!(back.as_slice().unwrap().iter().all(|&v| v == 7));
}

/// Of a kernel the crate did not launch (other code's, declared with `enqueue_foreign`), a parameter holding
/// the address just past the end of the buffer to replace is refused, with nothing changed: it may be an end
/// pointer of it or the start of the memory after it, and the crate cannot tell which.
#[test]
fn a_foreign_kernel_holding_the_address_just_past_the_end_is_refused() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let a = Stream::new(&ctx).unwrap();
    let module = common::test_kernels(&ctx).unwrap();
    let kernel = module.kernel("scale").unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(&a, N).unwrap();
    let mut z = DeviceBuffer::<f32>::zeroed(&a, N).unwrap();
    let x = Pinned::<f32>::zeroed(&ctx, N).unwrap();
    let (end, z_raw) = (y.as_raw() + (N * 4) as u64, z.as_raw());
    let mut graph = Graph::capture(&[&a], || {
        a.upload(&x, &mut y)?;
        // SAFETY: scale(const float* x, float* y, float a, unsigned n) with n = 0 touches no element: `end`
        // stands for a pointer the kernel is handed and does not dereference; `z` is declared written.
        unsafe {
            a.enqueue_foreign(&[Use::write(&mut z), Use::module(&module)], |raw| {
                let (scale, n) = (2.0f32, 0u32);
                let mut params = [
                    (&raw const end).cast_mut().cast::<std::ffi::c_void>(),
                    (&raw const z_raw).cast_mut().cast(),
                    (&raw const scale).cast_mut().cast(),
                    (&raw const n).cast_mut().cast(),
                ];
                cuda_pinned::driver_call!(cuLaunchKernel(
                    kernel.as_raw(),
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    raw,
                    params.as_mut_ptr(),
                    std::ptr::null_mut()
                ))
            })
        }?
    })
    .unwrap();
    let mut y2 = DeviceBuffer::<f32>::zeroed(&a, N).unwrap();
    refused(graph.replace(&y, &mut y2), "just past the end");
    graph.launch(&a).unwrap();
    a.synchronize().unwrap();
}

/// Device allocations laid end to end (as a GPU's may be): the kernel's pointer to the buffer after the one
/// replaced, which is the address just past it, is a pointer to that other buffer (given as memory), and stays.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_pointer_to_the_next_buffer_stays_where_allocations_lie_end_to_end() {
    let _serial = serial_on_two_devices();
    let sim = common::sim().unwrap();
    struct Gaps<'a>(&'a cuda_pinned_sim::Control);
    impl Drop for Gaps<'_> {
        fn drop(&mut self) {
            self.0.lay_device_allocations_end_to_end(false);
        }
    }
    sim.lay_device_allocations_end_to_end(true);
    let _gaps = Gaps(sim);
    let ctx = context();
    let a = Stream::new(&ctx).unwrap();
    let kernel = add_kernel(&ctx);
    let host = Pinned::from_slice(&ctx, &data(N, 10)).unwrap();
    let x = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let mut y = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    assert_eq!(
        y.as_raw(),
        x.as_raw() + (N * 4) as u64,
        "not laid end to end"
    );
    let mut graph = Graph::capture(&[&a], || {
        let n = u32::try_from(N).unwrap();
        // SAFETY: add_u32(const unsigned*, unsigned*, unsigned, unsigned) reads x[..n], writes y[..n].
        unsafe {
            a.launch(
                &kernel,
                LaunchConfig::for_elements(N, 256).unwrap(),
                &[
                    Arg::read(&x),
                    Arg::write(&mut y),
                    Arg::value(&1u32),
                    Arg::value(&n),
                ],
            )
        }
    })
    .unwrap();
    let mut x2 = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    a.upload(&host, &mut x2).unwrap();
    graph.replace(&x, &mut x2).unwrap();
    graph.launch(&a).unwrap();
    let mut back = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    a.download(&y, &mut back).unwrap();
    assert_eq!(back.as_slice().unwrap(), &plus(&data(N, 10), 1)[..]);
    drop(x);
}
