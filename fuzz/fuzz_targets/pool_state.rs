//! Arbitrary programs against the pinned pool's state machine (`src/memory/pool/state.rs`) on a simulated
//! device: requests that hit, pin (the pin then succeeding or failing) or are refused; device work on the blocks
//! held, on three streams; blocks given back with that work pending; the device running; waiting for room as
//! the pool does (`wait_for_any`: the oldest pending block's marks, waited for outside the state), `poll_pending`,
//! `trim` and `drain`; and device calls that fail. `cuda_pinned::fuzzing::pool::run` checks
//! after every step that the budget holds, that a block leaves the pool only when it was given back, nobody
//! holds it and all device work on it has run, that the stats equal its model's, and at the end (everything
//! given back, the pool drained) that every block pinned left the pool exactly once. The pool's property test
//! runs the same model on programs of its own.
//!
//! Input layout (a short input reads as zeros; the steps run to the end of the input):
//!
//! | bytes | meaning                                                                                        |
//! |-------|------------------------------------------------------------------------------------------------|
//! | 0     | the budget: this many pages (of 4096 bytes) ...                                                |
//! | 1     | ... plus 16 times this many bytes, so that it need not be a multiple of the page                |
//! | 2     | failures: one device call in this many fails, at random (0: none; 1: every call)               |
//! | 3     | the seed of those failures                                                                     |
//! | 4     | flags: bit 0 the wind-down waits for every pending block before the final `drain`              |
//! | then  | steps: an opcode byte (modulo 9), then its operand bytes                                       |
//!
//! | opcode | step          | operands                                                                       |
//! |--------|---------------|--------------------------------------------------------------------------------|
//! | 0      | `take`        | a byte `k`: `SIZES[k % 32]` if that is below 16, else 3 more bytes, the size  |
//! |        |               | in bytes, little-endian (0 to 16 MiB)                                          |
//! | 1      | resolve a pin | a byte `r`: reservation `r >> 1` (modulo those open), `pinned` if bit 0 is     |
//! |        |               | clear, else `pin_failed`                                                       |
//! | 2      | device work   | a byte `u`: holder `u >> 3` (modulo those holding a block), stream `u & 3`     |
//! |        |               | (modulo 3), a write if bit 2 is set, else a read                               |
//! | 3      | `give_back`   | a byte: the holder (modulo those holding a block)                              |
//! | 4      | run device    | a byte `a`: stream `a & 3` (modulo 3) runs up to `(a >> 2) + 1` operations     |
//! | 5      | wait for room | none: `wait_for_any` (polls; else waits for the oldest pending block's marks)  |
//! | 6      | `poll_pending`| none                                                                           |
//! | 7      | `trim`        | none                                                                           |
//! | 8      | `drain`       | none                                                                           |

#![no_main]

use cuda_pinned::fuzzing::pool::{PAGE, Program, Step, run};
use cuda_pinned_fuzz::Reader;
use libfuzzer_sys::fuzz_target;

/// Request sizes worth reaching in one byte: around a page and the 16 pages where the classes change granule,
/// a few that share classes, and some above any budget here or above any allocation.
const SIZES: [usize; 16] = [
    0,
    1,
    PAGE - 1,
    PAGE,
    PAGE + 1,
    2 * PAGE,
    3 * PAGE,
    5 * PAGE - 7,
    16 * PAGE,
    16 * PAGE + 1,
    20 * PAGE,
    64 * PAGE,
    1 << 20,
    1 << 30,
    isize::MAX as usize + 1,
    usize::MAX,
];

fn step(input: &mut Reader<'_>) -> Step {
    match input.byte() % 9 {
        0 => {
            let k = usize::from(input.byte() % 32);
            let bytes = match SIZES.get(k) {
                Some(&bytes) => bytes,
                None => {
                    let [a, b, c] = input.bytes();
                    u32::from_le_bytes([a, b, c, 0]) as usize
                }
            };
            Step::Take { bytes }
        }
        1 => {
            let r = input.byte();
            Step::Resolve {
                reservation: usize::from(r >> 1),
                ok: r & 1 == 0,
            }
        }
        2 => {
            let u = input.byte();
            Step::Use {
                holder: usize::from(u >> 3),
                stream: usize::from(u & 3),
                write: u & 4 != 0,
            }
        }
        3 => Step::GiveBack {
            holder: usize::from(input.byte()),
        },
        4 => {
            let a = input.byte();
            Step::Advance {
                stream: usize::from(a & 3),
                ops: usize::from(a >> 2) + 1,
            }
        }
        5 => Step::WaitForAny,
        6 => Step::Poll,
        7 => Step::Trim,
        _ => Step::Drain,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Reader::new(data);
    let budget = usize::from(input.byte()) * PAGE + usize::from(input.byte()) * 16;
    let fail_one_in = u64::from(input.byte());
    let seed = u64::from(input.byte());
    let wait_at_end = input.byte() & 1 != 0;
    let mut steps = Vec::new();
    while !input.is_empty() {
        steps.push(step(&mut input));
    }
    run(&Program {
        budget,
        steps,
        fail_one_in,
        seed,
        wait_at_end,
    });
});
