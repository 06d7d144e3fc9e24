//! Random programs against a CPU model: proptest generates sequences of copies, kernels, event waits, host
//! accesses and buffer replacements over 2-4 streams and a few device and pinned buffers of assorted sizes,
//! runs them on the GPU, and checks every element against a model that applies the operations in program
//! order. That is the tracker's promise: each operation sees the effects of every conflicting earlier one,
//! whichever stream either ran on. Short `spin`s on random streams hold earlier work back while other streams
//! race ahead, so a missing device-side wait shows as wrong data rather than as luck.
//!
//! `CUDA_PINNED_PROP_CASES` sets the number of programs (48 by default), `CUDA_PINNED_PROP_SEED` the seed
//! of the generator (random by default; a failure reports the one it used).

mod common;

use std::ops::Range;
use std::time::Duration;

#[cfg(not(feature = "gpu"))]
use common::kernels;
use common::{data, serial};
#[cfg(feature = "gpu")]
use cuda_pinned::kernels;
use cuda_pinned::{Context, DeviceBuffer, Event, Pinned, Stream};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// Lengths of buffers, in `u32` elements: odd ones, one past a power of two, and 4 MiB.
const SIZES: [usize; 5] = [1, 7, 4096, 65_537, 1 << 20];
const DEVICE_BUFFERS: usize = 4;
const PINNED_BUFFERS: usize = 3;
const MAX_STREAMS: usize = 4;
/// The longest `spin`, in microseconds: longer than a 4 MiB copy, so work behind it is overtaken.
const MAX_SPIN_US: u64 = 400;

fn context() -> Context {
    Context::on(0).expect("a CUDA device under feature `gpu`")
}

/// `SplitMix64`: the values a program writes, from the program's seed, in program order.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), near enough.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A fresh value, odd so that it is never mistaken for the zeros of a new buffer.
    fn value(&mut self) -> u32 {
        (self.next() >> 32) as u32 | 1
    }

    fn fill(&mut self, out: &mut [u32]) {
        for x in out {
            *x = self.value();
        }
    }

    fn values(&mut self, len: usize) -> Vec<u32> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

/// How an operand is passed: the buffer itself, or a view made with `slice` or `slice_mut`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Whole,
    View,
    ViewMut,
}

/// The elements an operation on a pair of buffers touches: ranges of equal length in each.
#[derive(Clone, Debug)]
struct Span {
    src: Range<usize>,
    dst: Range<usize>,
    src_shape: Shape,
    dst_shape: Shape,
}

/// The span that `pick` selects in buffers of `src_len` and `dst_len` elements (both > 0). A pick that is a
/// multiple of 4 (such as 0, where shrinking goes) is the longest span from the start of both.
fn span(pick: u64, src_len: usize, dst_len: usize) -> Span {
    let mut rng = SplitMix64(pick);
    let most = src_len.min(dst_len);
    let (count, src_at, dst_at) = if pick.is_multiple_of(4) {
        (most, 0, 0)
    } else {
        let count = match pick % 4 {
            1 => 1 + rng.below(most.min(64)),
            _ => 1 + rng.below(most),
        };
        (
            count,
            rng.below(src_len - count + 1),
            rng.below(dst_len - count + 1),
        )
    };
    let whole = |at: usize, len: usize, rng: &mut SplitMix64| {
        at == 0 && count == len && !rng.next().is_multiple_of(3)
    };
    let src_shape = if whole(src_at, src_len, &mut rng) {
        Shape::Whole
    } else if rng.next().is_multiple_of(2) {
        Shape::View
    } else {
        Shape::ViewMut
    };
    let dst_shape = if whole(dst_at, dst_len, &mut rng) {
        Shape::Whole
    } else {
        Shape::ViewMut
    };
    Span {
        src: src_at..src_at + count,
        dst: dst_at..dst_at + count,
        src_shape,
        dst_shape,
    }
}

/// `d2`, `p0[5..12]`, `d1[0..7]mut`: an operand as the log shows it.
fn operand(kind: char, index: usize, shape: Shape, range: &Range<usize>) -> String {
    match shape {
        Shape::Whole => format!("{kind}{index}"),
        Shape::View => format!("{kind}{index}[{range:?}]"),
        Shape::ViewMut => format!("{kind}{index}[{range:?}]mut"),
    }
}

/// Evaluates `$body` (a `cuda_pinned::Result`) with `$x` bound to `&$buf` or to a shared reference to a view
/// of `$range` of it, as `$shape` says: the source of an operation.
macro_rules! as_source {
    ($shape:expr, $buf:expr, $range:expr, |$x:ident| $body:expr) => {
        match $shape {
            Shape::Whole => {
                let $x = &*$buf;
                $body
            }
            Shape::View => match $buf.slice($range) {
                Ok(view) => {
                    let $x = &view;
                    $body
                }
                Err(e) => Err(e),
            },
            Shape::ViewMut => match $buf.slice_mut($range) {
                Ok(view) => {
                    let $x = &view;
                    $body
                }
                Err(e) => Err(e),
            },
        }
    };
}

/// As `as_source!`, with `$x` an exclusive reference to `$buf` or to a `slice_mut` view: the destination.
macro_rules! as_destination {
    ($shape:expr, $buf:expr, $range:expr, |$x:ident| $body:expr) => {
        match $shape {
            Shape::Whole => {
                let $x = &mut *$buf;
                $body
            }
            Shape::View | Shape::ViewMut => match $buf.slice_mut($range) {
                Ok(mut view) => {
                    let $x = &mut view;
                    $body
                }
                Err(e) => Err(e),
            },
        }
    };
}

/// One operation. Stream indices are taken modulo the program's number of streams; `pick` selects the
/// elements (see [`span`]); values come from the program's generator, in program order.
#[derive(Clone, Debug)]
enum Op {
    /// `stream.upload(pinned[from], device[to])`.
    Upload {
        stream: usize,
        from: usize,
        to: usize,
        pick: u64,
    },
    /// `stream.download(device[from], pinned[to])`.
    Download {
        stream: usize,
        from: usize,
        to: usize,
        pick: u64,
    },
    /// `stream.copy(device[from], device[(from + step) % 4])`, `step` in 1..4.
    Copy {
        stream: usize,
        from: usize,
        step: usize,
        pick: u64,
    },
    /// `stream.upload_pageable(fresh values, device[to])`.
    UploadPageable { stream: usize, to: usize, pick: u64 },
    /// `stream.download_pageable(device[from], vec)`, checked at once.
    DownloadPageable {
        stream: usize,
        from: usize,
        pick: u64,
    },
    /// `kernels::fill(stream, device[to], fresh value)`.
    Fill { stream: usize, to: usize, pick: u64 },
    /// `kernels::spin(stream, micros)`: holds back what follows on the stream.
    Spin { stream: usize, micros: u64 },
    /// An event recorded on one stream and waited for by another: extra ordering, harmless.
    EventWait { from: usize, step: usize },
    /// `pinned[index].as_slice()`, checked at once.
    HostRead { index: usize },
    /// `pinned[index].as_mut_slice()`, fresh values written into the picked range.
    HostWrite { index: usize, pick: u64 },
    /// `try_as_slice`: checked if it lends the memory.
    TryHostRead { index: usize },
    /// `try_as_mut_slice`: written if it lends the memory.
    TryHostWrite { index: usize, pick: u64 },
    /// Replaces `device[index]` (work may be in flight on it) with a new buffer allocated on `stream`, of the
    /// old length or `SIZES[size]`: zeroed, or uninitialised and then filled. The old one is dropped before the
    /// allocation (so that its memory may be handed out again at once) or after.
    ReplaceDevice {
        stream: usize,
        index: usize,
        size: Option<usize>,
        filled: bool,
        drop_first: bool,
    },
    /// Replaces `pinned[index]` with a new buffer, zeroed or a copy of fresh values.
    ReplacePinned {
        index: usize,
        size: Option<usize>,
        fresh: bool,
        drop_first: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let stream = 0..MAX_STREAMS;
    let device = 0..DEVICE_BUFFERS;
    let pinned = 0..PINNED_BUFFERS;
    let step = 1..DEVICE_BUFFERS;
    let pick = any::<u64>();
    let size = prop::option::weighted(0.5, 0..SIZES.len());
    prop_oneof![
        4 => (stream.clone(), pinned.clone(), device.clone(), pick)
            .prop_map(|(stream, from, to, pick)| Op::Upload { stream, from, to, pick }),
        4 => (stream.clone(), device.clone(), pinned.clone(), pick)
            .prop_map(|(stream, from, to, pick)| Op::Download { stream, from, to, pick }),
        5 => (stream.clone(), device.clone(), step.clone(), pick)
            .prop_map(|(stream, from, step, pick)| Op::Copy { stream, from, step, pick }),
        2 => (stream.clone(), device.clone(), pick)
            .prop_map(|(stream, to, pick)| Op::UploadPageable { stream, to, pick }),
        2 => (stream.clone(), device.clone(), pick)
            .prop_map(|(stream, from, pick)| Op::DownloadPageable { stream, from, pick }),
        3 => (stream.clone(), device.clone(), pick)
            .prop_map(|(stream, to, pick)| Op::Fill { stream, to, pick }),
        7 => (stream.clone(), 1..=MAX_SPIN_US)
            .prop_map(|(stream, micros)| Op::Spin { stream, micros }),
        1 => (stream.clone(), 1..MAX_STREAMS)
            .prop_map(|(from, step)| Op::EventWait { from, step }),
        2 => pinned.clone().prop_map(|index| Op::HostRead { index }),
        2 => (pinned.clone(), pick).prop_map(|(index, pick)| Op::HostWrite { index, pick }),
        1 => pinned.clone().prop_map(|index| Op::TryHostRead { index }),
        1 => (pinned.clone(), pick).prop_map(|(index, pick)| Op::TryHostWrite { index, pick }),
        1 => (stream, device, size.clone(), any::<bool>(), any::<bool>()).prop_map(
            |(stream, index, size, filled, drop_first)| Op::ReplaceDevice {
                stream,
                index,
                size,
                filled,
                drop_first,
            }
        ),
        1 => (pinned, size, any::<bool>(), any::<bool>()).prop_map(
            |(index, size, fresh, drop_first)| Op::ReplacePinned { index, size, fresh, drop_first }
        ),
    ]
}

/// A program: its buffers' lengths, its streams, its operations.
#[derive(Clone, Debug)]
struct Program {
    /// Seeds the values written.
    seed: u64,
    streams: usize,
    /// Index into `SIZES` of the length most buffers have (so that many operations take whole buffers).
    common_size: usize,
    /// Per buffer, devices first: `None` for the common length, else an index into `SIZES`.
    sizes: Vec<Option<usize>>,
    ops: Vec<Op>,
}

impl Program {
    fn len_of(&self, buffer: usize) -> usize {
        SIZES[self.sizes[buffer].unwrap_or(self.common_size)]
    }
}

fn program() -> impl Strategy<Value = Program> {
    (
        any::<u64>(),
        2..=MAX_STREAMS,
        0..SIZES.len(),
        prop::collection::vec(
            prop::option::weighted(0.3, 0..SIZES.len()),
            DEVICE_BUFFERS + PINNED_BUFFERS,
        ),
        prop::collection::vec(op(), 10..=40),
    )
        .prop_map(|(seed, streams, common_size, sizes, ops)| Program {
            seed,
            streams,
            common_size,
            sizes,
            ops,
        })
}

/// Where `got` first differs from `want`, as an error message.
fn compare(got: &[u32], want: &[u32], what: &str) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, the model has {}",
            got.len(),
            want.len()
        ));
    }
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .expect("unequal slices of equal length differ somewhere");
    Err(format!(
        "{what}: element {i} of {} is {:#010x}, the model says {:#010x} ({differ} elements differ)",
        want.len(),
        got[i],
        want[i]
    ))
}

fn gpu<T>(result: cuda_pinned::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("CUDA call failed: {e}"))
}

/// A program being run: the buffers, the model of their contents, and the log of what was done.
struct Run<'a> {
    ctx: &'a Context,
    streams: Vec<Stream>,
    device: Vec<DeviceBuffer<u32>>,
    pinned: Vec<Pinned<u32>>,
    device_model: Vec<Vec<u32>>,
    pinned_model: Vec<Vec<u32>>,
    rng: SplitMix64,
    log: Vec<String>,
}

impl Run<'_> {
    fn stream(&self, index: usize) -> &Stream {
        &self.streams[index % self.streams.len()]
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        let n = self.streams.len();
        match *op {
            Op::Upload {
                stream,
                from,
                to,
                pick,
            } => {
                let s = &self.streams[stream % n];
                let (src, dst) = (&mut self.pinned[from], &mut self.device[to]);
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{} upload {} -> {}",
                    stream % n,
                    operand('p', from, sp.src_shape, &sp.src),
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                gpu(as_source!(sp.src_shape, src, sp.src.clone(), |x| {
                    as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| s.upload(x, y))
                }))?;
                self.device_model[to][sp.dst].copy_from_slice(&self.pinned_model[from][sp.src]);
            }
            Op::Download {
                stream,
                from,
                to,
                pick,
            } => {
                let s = &self.streams[stream % n];
                let (src, dst) = (&mut self.device[from], &mut self.pinned[to]);
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{} download {} -> {}",
                    stream % n,
                    operand('d', from, sp.src_shape, &sp.src),
                    operand('p', to, sp.dst_shape, &sp.dst)
                ));
                gpu(as_source!(sp.src_shape, src, sp.src.clone(), |x| {
                    as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| s.download(x, y))
                }))?;
                self.pinned_model[to][sp.dst].copy_from_slice(&self.device_model[from][sp.src]);
            }
            Op::Copy {
                stream,
                from,
                step,
                pick,
            } => {
                let to = (from + step) % DEVICE_BUFFERS;
                let s = &self.streams[stream % n];
                let [src, dst] = self
                    .device
                    .get_disjoint_mut([from, to])
                    .expect("distinct indices");
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{} copy {} -> {}",
                    stream % n,
                    operand('d', from, sp.src_shape, &sp.src),
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                gpu(as_source!(sp.src_shape, src, sp.src.clone(), |x| {
                    as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| s.copy(x, y))
                }))?;
                let moved = self.device_model[from][sp.src].to_vec();
                self.device_model[to][sp.dst].copy_from_slice(&moved);
            }
            Op::UploadPageable { stream, to, pick } => {
                let s = &self.streams[stream % n];
                let dst = &mut self.device[to];
                let sp = span(pick, dst.len(), dst.len());
                self.log.push(format!(
                    "s{} upload_pageable fresh -> {}",
                    stream % n,
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                let values = self.rng.values(sp.dst.len());
                gpu(as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| s
                    .upload_pageable(&values, y)))?;
                self.device_model[to][sp.dst].copy_from_slice(&values);
            }
            Op::DownloadPageable { stream, from, pick } => {
                let s = &self.streams[stream % n];
                let src = &mut self.device[from];
                let sp = span(pick, src.len(), src.len());
                self.log.push(format!(
                    "s{} download_pageable {} -> vec (checked)",
                    stream % n,
                    operand('d', from, sp.src_shape, &sp.src)
                ));
                // Not the model's values, nor zeros: a copy that did not happen shows.
                let mut got = vec![0xDEAD_BEEF; sp.src.len()];
                gpu(as_source!(sp.src_shape, src, sp.src.clone(), |x| s
                    .download_pageable(x, &mut got)))?;
                compare(
                    &got,
                    &self.device_model[from][sp.src],
                    &format!("download_pageable of d{from}"),
                )?;
            }
            Op::Fill { stream, to, pick } => {
                let s = &self.streams[stream % n];
                let dst = &mut self.device[to];
                let sp = span(pick, dst.len(), dst.len());
                let value = self.rng.value();
                self.log.push(format!(
                    "s{} fill {} with {value:#010x}",
                    stream % n,
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                gpu(as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| {
                    kernels::fill(s, y, value)
                }))?;
                self.device_model[to][sp.dst].fill(value);
            }
            Op::Spin { stream, micros } => {
                self.log.push(format!("s{} spin {micros} us", stream % n));
                gpu(kernels::spin(
                    self.stream(stream),
                    Duration::from_micros(micros),
                ))?;
            }
            Op::EventWait { from, step } => {
                let (a, b) = (from % n, (from + step) % n);
                self.log
                    .push(format!("event recorded on s{a}, waited for by s{b}"));
                let event = gpu(Event::without_timing(self.ctx))?;
                gpu(event.record(&self.streams[a]))?;
                gpu(self.streams[b].wait(&event))?;
            }
            Op::HostRead { index } => {
                self.log.push(format!("host reads p{index} (checked)"));
                let got = gpu(self.pinned[index].as_slice())?;
                compare(
                    got,
                    &self.pinned_model[index],
                    &format!("as_slice of p{index}"),
                )?;
            }
            Op::HostWrite { index, pick } => {
                let len = self.pinned[index].len();
                let range = span(pick, len, len).dst;
                self.log.push(format!("host writes p{index}[{range:?}]"));
                let slice = gpu(self.pinned[index].as_mut_slice())?;
                self.rng.fill(&mut slice[range.clone()]);
                self.pinned_model[index][range.clone()].copy_from_slice(&slice[range]);
            }
            Op::TryHostRead { index } => match gpu(self.pinned[index].try_as_slice())? {
                Some(got) => {
                    self.log
                        .push(format!("host try-reads p{index}: lent (checked)"));
                    compare(
                        got,
                        &self.pinned_model[index],
                        &format!("try_as_slice of p{index}"),
                    )?;
                }
                None => self.log.push(format!("host try-reads p{index}: busy")),
            },
            Op::TryHostWrite { index, pick } => {
                let len = self.pinned[index].len();
                let range = span(pick, len, len).dst;
                match gpu(self.pinned[index].try_as_mut_slice())? {
                    Some(slice) => {
                        self.log
                            .push(format!("host try-writes p{index}[{range:?}]: lent"));
                        self.rng.fill(&mut slice[range.clone()]);
                        self.pinned_model[index][range.clone()].copy_from_slice(&slice[range]);
                    }
                    None => self
                        .log
                        .push(format!("host try-writes p{index}[{range:?}]: busy")),
                }
            }
            Op::ReplaceDevice {
                stream,
                index,
                size,
                filled,
                drop_first,
            } => {
                let len = size.map_or(self.device[index].len(), |k| SIZES[k]);
                let s = self.streams[stream % n].clone();
                let value = self.rng.value();
                self.log.push(format!(
                    "replace d{index} ({}) with {len} elements on s{}, {}",
                    if drop_first {
                        "dropped first"
                    } else {
                        "dropped after"
                    },
                    stream % n,
                    if filled {
                        format!("uninit then filled with {value:#010x}")
                    } else {
                        "zeroed".to_owned()
                    }
                ));
                let old = drop_first.then(|| self.device.remove(index));
                drop(old);
                let mut fresh = if filled {
                    let mut fresh = gpu(DeviceBuffer::uninit(&s, len))?;
                    gpu(kernels::fill(&s, &mut fresh, value))?;
                    fresh
                } else {
                    gpu(DeviceBuffer::zeroed(&s, len))?
                };
                if drop_first {
                    self.device.insert(index, fresh);
                } else {
                    std::mem::swap(&mut self.device[index], &mut fresh);
                    drop(fresh);
                }
                self.device_model[index] = vec![if filled { value } else { 0 }; len];
            }
            Op::ReplacePinned {
                index,
                size,
                fresh,
                drop_first,
            } => {
                let len = size.map_or(self.pinned[index].len(), |k| SIZES[k]);
                self.log.push(format!(
                    "replace p{index} ({}) with {len} elements, {}",
                    if drop_first {
                        "dropped first"
                    } else {
                        "dropped after"
                    },
                    if fresh { "fresh values" } else { "zeroed" }
                ));
                let old = drop_first.then(|| self.pinned.remove(index));
                drop(old);
                let contents = if fresh {
                    self.rng.values(len)
                } else {
                    vec![0; len]
                };
                let mut new = if fresh {
                    gpu(Pinned::from_slice(self.ctx, &contents))?
                } else {
                    gpu(Pinned::zeroed(self.ctx, len))?
                };
                if drop_first {
                    self.pinned.insert(index, new);
                } else {
                    std::mem::swap(&mut self.pinned[index], &mut new);
                    drop(new);
                }
                self.pinned_model[index] = contents;
            }
        }
        Ok(())
    }

    /// Reads back every buffer and compares every element: device buffers each on a stream of their own
    /// choosing (so the reads must wait for whatever wrote them last), pinned ones through `as_slice`.
    fn check_all(&self, when: &str) -> Result<(), String> {
        for (i, (buffer, model)) in self.device.iter().zip(&self.device_model).enumerate() {
            let mut got = vec![0xDEAD_BEEF; buffer.len()];
            gpu(self.stream(i).download_pageable(buffer, &mut got))?;
            compare(&got, model, &format!("{when}: d{i}"))?;
        }
        for (i, (buffer, model)) in self.pinned.iter().zip(&self.pinned_model).enumerate() {
            compare(gpu(buffer.as_slice())?, model, &format!("{when}: p{i}"))?;
        }
        Ok(())
    }
}

/// Runs `program` and checks it; on failure, the message carries the log of what ran.
fn run_program(ctx: &Context, program: &Program) -> Result<(), String> {
    let mut rng = SplitMix64(program.seed);
    let streams = (0..program.streams)
        .map(|_| gpu(Stream::new(ctx)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut run = Run {
        ctx,
        streams,
        device: Vec::new(),
        pinned: Vec::new(),
        device_model: Vec::new(),
        pinned_model: Vec::new(),
        rng: SplitMix64(0),
        log: Vec::new(),
    };
    for i in 0..DEVICE_BUFFERS {
        let len = program.len_of(i);
        let values = rng.values(len);
        let stream = &run.streams[i % program.streams];
        let mut buffer = gpu(DeviceBuffer::uninit(stream, len))?;
        gpu(stream.upload_pageable(&values, &mut buffer))?;
        run.log.push(format!(
            "d{i}: {len} elements, uploaded on s{}",
            i % program.streams
        ));
        run.device.push(buffer);
        run.device_model.push(values);
    }
    for i in 0..PINNED_BUFFERS {
        let len = program.len_of(DEVICE_BUFFERS + i);
        let values = rng.values(len);
        run.pinned.push(gpu(Pinned::from_slice(ctx, &values))?);
        run.pinned_model.push(values);
        run.log.push(format!("p{i}: {len} elements"));
    }
    run.rng = rng;
    let result = (|| {
        for (i, op) in program.ops.iter().enumerate() {
            run.step(op).map_err(|e| format!("at op {i}: {e}"))?;
        }
        // Without synchronising first: the reads must wait for the writers by themselves.
        run.check_all("at the end")?;
        gpu(ctx.synchronize())?;
        run.check_all("at the end, after synchronising the context")
    })();
    let log = std::mem::take(&mut run.log);
    drop(run);
    let result = result.and_then(|()| {
        gpu(ctx.synchronize())?;
        gpu(ctx.check_deferred_errors())
    });
    result.map_err(|e| {
        let mut message = format!("{e}\nwhat ran:\n");
        for line in log {
            message.push_str("  ");
            message.push_str(&line);
            message.push('\n');
        }
        message
    })
}

/// A number from the environment variable `name`, if set.
fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

#[test]
fn random_programs_over_several_streams_match_the_model() {
    let _serial = serial();
    let ctx = context();
    let cases =
        env_number("CUDA_PINNED_PROP_CASES").map_or(48, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let seed = env_number("CUDA_PINNED_PROP_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        SplitMix64(now ^ (u64::from(std::process::id()) << 32)).next()
    });
    let config = Config {
        cases,
        // The binary runs from a read-only copy on another machine: no regressions file.
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        // Each shrinking step runs a program on the GPU: bound the time spent on a failure.
        max_shrink_iters: 256,
        max_shrink_time: 30_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&program(), |program| {
        run_program(&ctx, &program).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, program)) => panic!(
            "a program disagreed with the model (CUDA_PINNED_PROP_SEED={seed} reproduces the run)\n\
             {reason}\nthe program (shrunk): {program:#?}"
        ),
        Err(e) => panic!("CUDA_PINNED_PROP_SEED={seed}: {e}"),
    }
}

/// A fixed adversarial program, whatever proptest generates: a slow producer on stream A writes `d0`, a
/// consumer on stream B copies `d0` into `d1`, a reader on stream C downloads `d1`, and A then overwrites `d0`
/// while B may still be reading it. Every step needs a device-side wait on another stream.
#[test]
fn a_slow_producer_a_consumer_and_a_reader_on_three_streams() {
    let _serial = serial();
    let ctx = context();
    let (a, b, c) = (
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
        Stream::new(&ctx).unwrap(),
    );
    let len = 1 << 20;
    let half = len / 2;
    let mut d0 = DeviceBuffer::<u32>::zeroed(&a, len).unwrap();
    let mut d1 = DeviceBuffer::<u32>::zeroed(&b, len).unwrap();
    let mut host = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    for round in 0..4u32 {
        let want = data(len, 1000 + u64::from(round));
        let overwrite = 0xA5A5_0001 + 2 * round;
        {
            let src = Pinned::from_slice(&ctx, &want).unwrap();
            kernels::spin(&a, Duration::from_millis(20)).unwrap();
            a.upload(&src, &mut d0).unwrap(); // runs only after the spin
            // `src` drops here, with the upload still queued behind the spin.
        }
        kernels::spin(&b, Duration::from_millis(5)).unwrap();
        b.copy(&d0, &mut d1).unwrap(); // must wait for A's upload
        c.download(&d1, &mut host).unwrap(); // must wait for B's copy
        kernels::fill(&a, &mut d0, overwrite).unwrap(); // must wait for B's read of d0
        compare(
            host.as_slice().unwrap(),
            &want,
            &format!("round {round}: d0 -> d1 -> host"),
        )
        .unwrap();
        let mut back = vec![0; len];
        c.download_pageable(&d0, &mut back).unwrap();
        compare(
            &back,
            &vec![overwrite; len],
            &format!("round {round}: the overwrite of d0 after B's read"),
        )
        .unwrap();
    }

    // The same through views: the front half of d0 produced slowly on A, copied into the back half of d1 on B,
    // downloaded into the front half of the host buffer on C.
    let want = data(half, 2000);
    let src = Pinned::from_slice(&ctx, &want).unwrap();
    kernels::spin(&a, Duration::from_millis(20)).unwrap();
    a.upload(&src, &mut d0.slice_mut(..half).unwrap()).unwrap();
    b.copy(
        &d0.slice(..half).unwrap(),
        &mut d1.slice_mut(half..).unwrap(),
    )
    .unwrap();
    c.download(
        &d1.slice(half..).unwrap(),
        &mut host.slice_mut(..half).unwrap(),
    )
    .unwrap();
    let got = host.as_slice().unwrap();
    compare(
        &got[..half],
        &want,
        "views: d0[..half] -> d1[half..] -> host[..half]",
    )
    .unwrap();
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}
