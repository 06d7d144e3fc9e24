//! A program of safe-API operations over several streams and a few device and pinned buffers, on one device
//! or two, run against a CPU model that applies the operations in program order: shared by the property tests
//! (tests/gpu_props.rs and tests/sim_staged_peer.rs through tests/common/program_cases.rs, programs from
//! proptest, on a GPU or the simulated driver) and the fuzz target `sim_programs` (programs from libFuzzer's
//! bytes, on the simulated driver). The tracker's promise is that each operation sees the
//! effects of every conflicting earlier one, whichever stream either ran on; `check_all` reads every element
//! back and compares. Short `spin`s on random streams hold earlier work back while other streams race ahead,
//! so a missing device-side wait shows as wrong data rather than as luck.
//!
//! With two devices, streams, device buffers and pinned buffers are dealt out to the devices in turn (stream
//! `j`, device buffer `i` and pinned buffer `i` belong to device `j % 2` or `i % 2`). An operation on a device
//! buffer runs on a stream of that buffer's device (its stream index is taken among that device's streams), a
//! copy between two devices' buffers on a stream of either, a launch reads and writes two buffers of one
//! device; pinned buffers of either device serve both, events of one device are waited for by the other's
//! streams, and every read waits for the writers whichever device they ran on.
//!
//! The including crate has a `common` module (tests/common/mod.rs) beside this one.
#![allow(dead_code, reason = "each includer uses a different subset")]

use std::ops::Range;
use std::time::Duration;

#[cfg(not(feature = "gpu"))]
use crate::common::kernels;
use crate::common::{SplitMix64, compare};
#[cfg(feature = "gpu")]
use cuda_pinned::kernels;
use cuda_pinned::{Arg, Context, DeviceBuffer, Event, LaunchConfig, Pinned, PinnedBuilder, Stream};

/// Lengths of buffers, in `u32` elements: odd ones, one past a power of two, and 4 MiB.
pub const SIZES: [usize; 5] = [1, 7, 4096, 65_537, 1 << 20];
pub const DEVICE_BUFFERS: usize = 4;
pub const PINNED_BUFFERS: usize = 3;
pub const MAX_STREAMS: usize = 4;
/// The most devices a program uses: each needs two device buffers for a launch (one read, one written).
pub const MAX_DEVICES: usize = DEVICE_BUFFERS / 2;
/// The longest `spin`, in microseconds: longer than a 4 MiB copy, so work behind it is overtaken.
pub const MAX_SPIN_US: u64 = 400;

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
pub enum Op {
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
    /// `stream.launch(add_u32, device[from] read, device[(from + step) % 4] written, add)`: a user's kernel,
    /// `y[i] = x[i] + add`.
    Launch {
        stream: usize,
        from: usize,
        step: usize,
        pick: u64,
        add: u32,
    },
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
    /// Replaces `pinned[index]` with a new buffer, zeroed or a copy of fresh values, portable or not (it serves
    /// every device's streams either way).
    ReplacePinned {
        index: usize,
        size: Option<usize>,
        fresh: bool,
        drop_first: bool,
        portable: bool,
    },
}

/// A program: its buffers' lengths, its streams, its operations.
#[derive(Clone, Debug)]
pub struct Program {
    /// Seeds the values written.
    pub seed: u64,
    /// How many streams (1 to `MAX_STREAMS`; at least one per device is made).
    pub streams: usize,
    /// How many devices (1 to `MAX_DEVICES`).
    pub devices: usize,
    /// Index into `SIZES` of the length most buffers have (so that many operations take whole buffers).
    pub common_size: usize,
    /// Per buffer, devices first: `None` for the common length, else an index into `SIZES`.
    pub sizes: Vec<Option<usize>>,
    pub ops: Vec<Op>,
}

impl Program {
    pub fn len_of(&self, buffer: usize) -> usize {
        SIZES[self.sizes[buffer].unwrap_or(self.common_size)]
    }
}

fn gpu<T>(result: cuda_pinned::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("CUDA call failed: {e}"))
}

/// A program being run: the buffers, the model of their contents, and the log of what was done.
struct Run<'a> {
    /// One per device the program uses.
    contexts: &'a [Context],
    /// Stream `j` belongs to device `j % contexts.len()`.
    streams: Vec<Stream>,
    device: Vec<DeviceBuffer<u32>>,
    pinned: Vec<Pinned<u32>>,
    device_model: Vec<Vec<u32>>,
    pinned_model: Vec<Vec<u32>>,
    rng: SplitMix64,
    log: Vec<String>,
    /// `add_u32` of the tests' user module (`cuda/test_kernels.cu`), loaded on each device.
    add: Vec<cuda_pinned::Kernel>,
}

impl Run<'_> {
    fn stream(&self, index: usize) -> &Stream {
        &self.streams[index % self.streams.len()]
    }

    /// The device of device buffer, pinned buffer or stream `index`.
    fn device_of(&self, index: usize) -> usize {
        index % self.contexts.len()
    }

    /// The stream that a stream operand `stream` picks among the streams of `device`.
    fn on(&self, stream: usize, device: usize) -> usize {
        let devices = self.contexts.len();
        let of_device = (self.streams.len() - device).div_ceil(devices);
        device + devices * (stream % of_device)
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
                let k = self.on(stream, self.device_of(to));
                let s = &self.streams[k];
                let (src, dst) = (&mut self.pinned[from], &mut self.device[to]);
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{k} upload {} -> {}",
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
                let k = self.on(stream, self.device_of(from));
                let s = &self.streams[k];
                let (src, dst) = (&mut self.device[from], &mut self.pinned[to]);
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{k} download {} -> {}",
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
                // Between two devices, on a stream of either.
                let sides = [self.device_of(from), self.device_of(to)];
                let k = if sides.contains(&self.device_of(stream % n)) {
                    stream % n
                } else {
                    self.on(stream, self.device_of(to))
                };
                let s = &self.streams[k];
                let [src, dst] = self
                    .device
                    .get_disjoint_mut([from, to])
                    .expect("distinct indices");
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{k} copy {} -> {}",
                    operand('d', from, sp.src_shape, &sp.src),
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                gpu(as_source!(sp.src_shape, src, sp.src.clone(), |x| {
                    as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| s.copy(x, y))
                }))?;
                let moved = self.device_model[from][sp.src].to_vec();
                self.device_model[to][sp.dst].copy_from_slice(&moved);
            }
            Op::Launch {
                stream,
                from,
                step,
                pick,
                add,
            } => {
                let devices = self.contexts.len();
                // Two buffers of one device (a kernel's pointers are its own device's).
                let mut to = (from + step) % DEVICE_BUFFERS;
                if self.device_of(to) != self.device_of(from) {
                    to = (from + devices) % DEVICE_BUFFERS;
                }
                let device = self.device_of(from);
                let k = self.on(stream, device);
                let s = &self.streams[k];
                let [src, dst] = self
                    .device
                    .get_disjoint_mut([from, to])
                    .expect("distinct indices");
                let sp = span(pick, src.len(), dst.len());
                self.log.push(format!(
                    "s{k} launch add_u32({}, {}, {add})",
                    operand('d', from, sp.src_shape, &sp.src),
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                let count = sp.src.len();
                let (config, n) = (gpu(LaunchConfig::for_elements(count, 256))?, count as u32);
                let kernel = &self.add[device];
                gpu(as_source!(sp.src_shape, src, sp.src.clone(), |x| {
                    as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| {
                        // SAFETY: add_u32(const unsigned*, unsigned*, unsigned, unsigned) reads x[..n] and
                        // writes y[..n], the two spans of `count` elements.
                        unsafe {
                            s.launch(
                                kernel,
                                config,
                                &[
                                    Arg::read(x),
                                    Arg::write(y),
                                    Arg::value(&add),
                                    Arg::value(&n),
                                ],
                            )
                        }
                    })
                }))?;
                let sums: Vec<u32> = self.device_model[from][sp.src]
                    .iter()
                    .map(|v| v.wrapping_add(add))
                    .collect();
                self.device_model[to][sp.dst].copy_from_slice(&sums);
            }
            Op::UploadPageable { stream, to, pick } => {
                let k = self.on(stream, self.device_of(to));
                let s = &self.streams[k];
                let dst = &mut self.device[to];
                let sp = span(pick, dst.len(), dst.len());
                self.log.push(format!(
                    "s{k} upload_pageable fresh -> {}",
                    operand('d', to, sp.dst_shape, &sp.dst)
                ));
                let values = self.rng.values(sp.dst.len());
                gpu(as_destination!(sp.dst_shape, dst, sp.dst.clone(), |y| s
                    .upload_pageable(&values, y)))?;
                self.device_model[to][sp.dst].copy_from_slice(&values);
            }
            Op::DownloadPageable { stream, from, pick } => {
                let k = self.on(stream, self.device_of(from));
                let s = &self.streams[k];
                let src = &mut self.device[from];
                let sp = span(pick, src.len(), src.len());
                self.log.push(format!(
                    "s{k} download_pageable {} -> vec (checked)",
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
                let k = self.on(stream, self.device_of(to));
                let s = &self.streams[k];
                let dst = &mut self.device[to];
                let sp = span(pick, dst.len(), dst.len());
                let value = self.rng.value();
                self.log.push(format!(
                    "s{k} fill {} with {value:#010x}",
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
                let event = gpu(Event::without_timing(&self.contexts[self.device_of(a)]))?;
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
                let k = self.on(stream, self.device_of(index));
                let s = self.streams[k].clone();
                let value = self.rng.value();
                self.log.push(format!(
                    "replace d{index} ({}) with {len} elements on s{k}, {}",
                    if drop_first {
                        "dropped first"
                    } else {
                        "dropped after"
                    },
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
                portable,
            } => {
                let len = size.map_or(self.pinned[index].len(), |k| SIZES[k]);
                self.log.push(format!(
                    "replace p{index} ({}) with {len} elements, {}{}",
                    if drop_first {
                        "dropped first"
                    } else {
                        "dropped after"
                    },
                    if fresh { "fresh values" } else { "zeroed" },
                    if portable { "" } else { ", not portable" }
                ));
                let old = drop_first.then(|| self.pinned.remove(index));
                drop(old);
                let contents = if fresh {
                    self.rng.values(len)
                } else {
                    vec![0; len]
                };
                let builder =
                    PinnedBuilder::new(&self.contexts[self.device_of(index)]).portable(portable);
                let mut new = if fresh {
                    gpu(builder.from_slice(&contents))?
                } else {
                    gpu(builder.zeroed(len))?
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
            let s = &self.streams[self.on(i, self.device_of(i))];
            gpu(s.download_pageable(buffer, &mut got))?;
            compare(&got, model, &format!("{when}: d{i}"))?;
        }
        for (i, (buffer, model)) in self.pinned.iter().zip(&self.pinned_model).enumerate() {
            compare(gpu(buffer.as_slice())?, model, &format!("{when}: p{i}"))?;
        }
        Ok(())
    }
}

/// Runs `program` on the first `program.devices` of `contexts` (one per device) and checks it; on failure, the
/// message carries the log of what ran.
pub fn run_program(contexts: &[Context], program: &Program) -> Result<(), String> {
    let Some(contexts) = contexts.get(..program.devices).filter(|c| !c.is_empty()) else {
        return Err(format!(
            "the program uses {} devices, {} given",
            program.devices,
            contexts.len()
        ));
    };
    let devices = contexts.len();
    let mut rng = SplitMix64(program.seed);
    let streams = (0..program.streams.max(devices))
        .map(|j| gpu(Stream::new(&contexts[j % devices])))
        .collect::<Result<Vec<_>, _>>()?;
    let add = contexts
        .iter()
        .map(
            |ctx| gpu(crate::common::test_kernels(ctx).and_then(|module| module.kernel("add_u32"))),
        )
        .collect::<Result<Vec<_>, _>>()?;
    let mut run = Run {
        contexts,
        streams,
        device: Vec::new(),
        pinned: Vec::new(),
        device_model: Vec::new(),
        pinned_model: Vec::new(),
        rng: SplitMix64(0),
        log: Vec::new(),
        add,
    };
    for j in 0..run.streams.len() {
        run.log.push(format!("s{j} on device {}", run.device_of(j)));
    }
    for i in 0..DEVICE_BUFFERS {
        let len = program.len_of(i);
        let values = rng.values(len);
        let k = run.on(i, run.device_of(i));
        let stream = &run.streams[k];
        let mut buffer = gpu(DeviceBuffer::uninit(stream, len))?;
        gpu(stream.upload_pageable(&values, &mut buffer))?;
        run.log.push(format!(
            "d{i}: {len} elements on device {}, uploaded on s{k}",
            run.device_of(i)
        ));
        run.device.push(buffer);
        run.device_model.push(values);
    }
    for i in 0..PINNED_BUFFERS {
        let len = program.len_of(DEVICE_BUFFERS + i);
        let values = rng.values(len);
        let ctx = &contexts[run.device_of(i)];
        run.pinned.push(gpu(Pinned::from_slice(ctx, &values))?);
        run.pinned_model.push(values);
        run.log.push(format!(
            "p{i}: {len} elements of device {}",
            run.device_of(i)
        ));
    }
    run.rng = rng;
    let synchronize = || contexts.iter().try_for_each(|ctx| gpu(ctx.synchronize()));
    let result = (|| {
        for (i, op) in program.ops.iter().enumerate() {
            run.step(op).map_err(|e| format!("at op {i}: {e}"))?;
        }
        // Without synchronising first: the reads must wait for the writers by themselves.
        run.check_all("at the end")?;
        synchronize()?;
        run.check_all("at the end, after synchronising the contexts")
    })();
    let log = std::mem::take(&mut run.log);
    drop(run);
    let result = result.and_then(|()| {
        synchronize()?;
        contexts
            .iter()
            .try_for_each(|ctx| gpu(ctx.check_deferred_errors()))
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
