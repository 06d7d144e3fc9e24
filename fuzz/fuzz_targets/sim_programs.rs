//! Arbitrary programs of safe-API operations over several streams and buffers, on one simulated device or two
//! (copies between them, pinned memory and events of one used by the other), run on the simulated driver
//! (crates/cuda-pinned-sim) and checked against a CPU model: uploads, downloads and device copies of whole buffers
//! and views, pageable transfers, fills, spins that hold a stream back, events recorded on one stream and
//! waited for by another, host reads and writes of pinned memory, and buffers replaced (dropped with work in
//! flight) mid-program. The program and its model are crates/cuda-pinned/tests/common/program.rs, shared with
//! the property test tests/gpu_props.rs there; every element of every buffer is compared at the end (and wherever the program reads
//! one), the simulator must find no violation (work touching freed memory, memory freed under queued work,
//! a hidden wait, a false dependency), and everything the program allocated must be gone once it ends. Events
//! are the exception: each context keeps those its work returns for reuse, at most a fixed number of them.
//!
//! The simulator is the one `cargo build -p cuda-pinned-sim --release` builds at the repository root (not the
//! sanitizer-instrumented copy cargo-fuzz builds beside this target): under `$CARGO_TARGET_DIR` if that was set
//! when this target was built, else `<root>/target`; `CUDA_PINNED_LIBCUDA` names another. Its queued work runs after random delays of up to 50 us unless `CUDA_SIM_MAX_DELAY_US` says other.
//!
//! Input layout (a short input reads as zeros; at most `MAX_OPS` operations, to the end of the input):
//!
//! | bytes | meaning                                                                                        |
//! |-------|------------------------------------------------------------------------------------------------|
//! | 0     | streams: 2 + this modulo 3; devices: 1 + (this / 3) modulo 2                                   |
//! | 1     | the common buffer length: `SIZES[this % 4]` elements                                           |
//! | 2-8   | a size byte per buffer (devices 0-3, then pinned 0-2): see below                               |
//! | 9-16  | the seed of the values written, little-endian                                                  |
//! | then  | operations: an opcode byte (modulo 14), then its operand bytes                                 |
//!
//! A size byte `z` means the common length if `z < 128`, else `SIZES[z % 4]` (1, 7, 4096 or 65537 `u32`s).
//! With two devices, streams and buffers are dealt out to them in turn, and an operation on a device buffer runs on
//! a stream of its device (see tests/common/program.rs). A stream byte is taken modulo the number of streams, a
//! buffer byte modulo the number of such buffers, and a
//! pick is 4 bytes, little-endian, choosing the elements and whether whole buffers or views are passed (see
//! `span` in tests/common/program.rs; a multiple of 4 means the longest span from the start of both).
//!
//! | opcode | operation                                     | operands                                      |
//! |--------|-----------------------------------------------|-----------------------------------------------|
//! | 0      | `upload(pinned[p], device[d])`                | stream, p, d, pick                            |
//! | 1      | `download(device[d], pinned[p])`              | stream, d, p, pick                            |
//! | 2      | `copy(device[d], device[d + 1 + k % 3])`      | stream, d, k, pick                            |
//! | 3      | `upload_pageable(fresh values, device[d])`    | stream, d, pick                               |
//! | 4      | `download_pageable(device[d], vec)`, checked  | stream, d, pick                               |
//! | 5      | fill `device[d]` (an upload on the simulator) | stream, d, pick                               |
//! | 6      | spin: the stream sleeps `1 + u` microseconds  | stream, u                                     |
//! | 7      | event on stream `s`, waited for by `s + 1 + k`| s, k                                          |
//! | 8      | `pinned[p].as_slice()`, checked               | p                                             |
//! | 9      | `pinned[p].as_mut_slice()`, fresh values      | p, pick                                       |
//! | 10     | `try_as_slice`, checked if lent               | p                                             |
//! | 11     | `try_as_mut_slice`, written if lent           | p, pick                                       |
//! | 12     | replace `device[d]` by a new buffer           | stream, d, size byte, flags                   |
//! | 13     | replace `pinned[p]` by a new buffer           | p, size byte, flags                           |
//!
//! Flags of a replacement: bit 0 the new buffer is filled with fresh values (else zeroed), bit 1 the old one
//! is dropped before the new one is allocated (else after), bit 2 a new pinned buffer is not portable.

#![no_main]

#[path = "../../crates/cuda-pinned/tests/common/mod.rs"]
mod common;
#[path = "../../crates/cuda-pinned/tests/common/program.rs"]
mod program;

use std::sync::LazyLock;

use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
use cuda_pinned_fuzz::Reader;
use libfuzzer_sys::fuzz_target;
use program::{DEVICE_BUFFERS, MAX_DEVICES, MAX_STREAMS, Op, PINNED_BUFFERS, Program};

/// Operations read at most: enough for long chains across streams, few enough for thousands of runs a minute.
const MAX_OPS: usize = 64;
/// The most idle events a context keeps for reuse (the crate's event pool), per context.
const POOLED_EVENTS_AT_MOST: u64 = 1024;
/// Buffer lengths come from the first four of `program::SIZES`: up to 65537 elements, 256 KiB.
const LENGTHS: u8 = 4;

/// The simulator built at the repository root, for this fuzz crate at `<root>/fuzz`.
fn simulator() -> String {
    match option_env!("CARGO_TARGET_DIR") {
        Some(dir) => format!("{dir}/release/libcuda_pinned_sim.so"),
        None => concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/release/libcuda_pinned_sim.so"
        )
        .to_string(),
    }
}

/// Points the crate at the simulator (unless `CUDA_PINNED_LIBCUDA` is set) before anything loads a driver.
fn use_simulator() {
    let set = |name: &str, value: &str| {
        if std::env::var_os(name).is_none() {
            // SAFETY: runs once, in libFuzzer's init, before any other thread of this process exists.
            unsafe { std::env::set_var(name, value) };
        }
    };
    let simulator = simulator();
    if std::env::var_os("CUDA_PINNED_LIBCUDA").is_none() {
        assert!(
            std::path::Path::new(&simulator).is_file(),
            "the simulated driver is not at {simulator}: run `cargo build -p cuda-pinned-sim --release` at the \
             repository root first, or set CUDA_PINNED_LIBCUDA and CUDA_PINNED_LIBCUDART to one"
        );
    }
    set("CUDA_PINNED_LIBCUDA", &simulator);
    set("CUDA_PINNED_LIBCUDART", &simulator);
    set("CUDA_SIM_MAX_DELAY_US", "50");
    set("CUDA_SIM_DEVICES", &MAX_DEVICES.to_string());
}

/// One context per device for the whole fuzzing process: each run makes its own streams and buffers. Each is
/// made with what a context keeps for its whole life once used, so that no run's count of live objects includes
/// it: its stream for frees that wait for several streams (made here by freeing a buffer written on one and
/// read on another).
static CONTEXTS: LazyLock<Vec<Context>> = LazyLock::new(|| {
    (0..MAX_DEVICES)
        .map(|ordinal| {
            let ctx = Context::on(ordinal).expect("the simulated driver has two devices");
            let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
            let mut host = Pinned::<u32>::zeroed(&ctx, 1).unwrap();
            let mut device = DeviceBuffer::<u32>::uninit(&a, 1).unwrap();
            a.upload(&host, &mut device).unwrap();
            b.download(&device, &mut host).unwrap();
            drop((device, host, a, b));
            ctx.synchronize().unwrap();
            ctx
        })
        .collect()
});

fn stream(r: &mut Reader) -> usize {
    usize::from(r.byte()) % MAX_STREAMS
}

fn device(r: &mut Reader) -> usize {
    usize::from(r.byte()) % DEVICE_BUFFERS
}

fn pinned(r: &mut Reader) -> usize {
    usize::from(r.byte()) % PINNED_BUFFERS
}

fn pick(r: &mut Reader) -> u64 {
    u64::from(r.u32_le())
}

/// A size byte: `None` for the program's common length, else an index into `program::SIZES`.
fn size(r: &mut Reader) -> Option<usize> {
    let z = r.byte();
    (z >= 128).then_some(usize::from(z % LENGTHS))
}

fn op(r: &mut Reader) -> Op {
    match r.byte() % 15 {
        0 => Op::Upload {
            stream: stream(r),
            from: pinned(r),
            to: device(r),
            pick: pick(r),
        },
        1 => Op::Download {
            stream: stream(r),
            from: device(r),
            to: pinned(r),
            pick: pick(r),
        },
        2 => Op::Copy {
            stream: stream(r),
            from: device(r),
            step: 1 + usize::from(r.byte()) % (DEVICE_BUFFERS - 1),
            pick: pick(r),
        },
        3 => Op::UploadPageable {
            stream: stream(r),
            to: device(r),
            pick: pick(r),
        },
        4 => Op::DownloadPageable {
            stream: stream(r),
            from: device(r),
            pick: pick(r),
        },
        5 => Op::Fill {
            stream: stream(r),
            to: device(r),
            pick: pick(r),
        },
        6 => Op::Spin {
            stream: stream(r),
            micros: 1 + u64::from(r.byte()),
        },
        7 => Op::EventWait {
            from: stream(r),
            step: 1 + usize::from(r.byte()) % (MAX_STREAMS - 1),
        },
        8 => Op::HostRead { index: pinned(r) },
        9 => Op::HostWrite {
            index: pinned(r),
            pick: pick(r),
        },
        10 => Op::TryHostRead { index: pinned(r) },
        11 => Op::TryHostWrite {
            index: pinned(r),
            pick: pick(r),
        },
        14 => Op::Launch {
            stream: stream(r),
            from: device(r),
            step: 1 + usize::from(r.byte()) % (DEVICE_BUFFERS - 1),
            pick: pick(r),
            add: r.u32_le(),
        },
        12 => {
            let (stream, index, size, flags) = (stream(r), device(r), size(r), r.byte());
            Op::ReplaceDevice {
                stream,
                index,
                size,
                filled: flags & 1 != 0,
                drop_first: flags & 2 != 0,
            }
        }
        _ => {
            let (index, size, flags) = (pinned(r), size(r), r.byte());
            Op::ReplacePinned {
                index,
                size,
                fresh: flags & 1 != 0,
                drop_first: flags & 2 != 0,
                portable: flags & 4 == 0,
            }
        }
    }
}

fn decode(data: &[u8]) -> Program {
    let mut r = Reader::new(data);
    let first = usize::from(r.byte());
    let streams = 2 + first % (MAX_STREAMS - 1);
    let devices = 1 + first / (MAX_STREAMS - 1) % MAX_DEVICES;
    let common_size = usize::from(r.byte() % LENGTHS);
    let sizes = (0..DEVICE_BUFFERS + PINNED_BUFFERS)
        .map(|_| size(&mut r))
        .collect();
    let seed = r.u64_le();
    let mut ops = Vec::new();
    while !r.is_empty() && ops.len() < MAX_OPS {
        ops.push(op(&mut r));
    }
    Program {
        seed,
        streams,
        devices,
        common_size,
        sizes,
        ops,
    }
}

fuzz_target!(
    init: {
        use_simulator();
        LazyLock::force(&CONTEXTS);
    },
    |data: &[u8]| {
        let program = decode(data);
        // Checks, when it drops, that the simulator found no violation.
        let _serial = common::serial();
        let sim = common::sim().expect("CUDA_PINNED_LIBCUDA names the simulated driver");
        let contexts = &*CONTEXTS;
        let before = sim.live();
        if let Err(e) = program::run_program(contexts, &program) {
            panic!("{e}\nthe program: {program:#?}");
        }
        for ctx in contexts {
            ctx.synchronize().expect("synchronize after the program");
        }
        let after = sim.live();
        let events = after.events;
        assert_eq!(
            cuda_pinned_sim::Live { events: 0, ..after },
            cuda_pinned_sim::Live { events: 0, ..before },
            "the program left something allocated: {program:#?}"
        );
        assert!(
            events <= POOLED_EVENTS_AT_MOST * MAX_DEVICES as u64,
            "{events} events live after the program: more than the contexts keep for reuse"
        );
    }
);
