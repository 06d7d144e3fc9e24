//! The tracker's tests against a simulated device: the device's uses check happens-before as they run. The
//! unit tests are in `tests/unit.rs`, the property tests over random programs in `tests/properties.rs`.

mod properties;
mod unit;

use super::sim::{self, Payload};
use super::{Access, Tracker};

/// How a use touches a buffer on the simulated device; `Free` is the stream-ordered release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Free,
}

impl From<Access> for Kind {
    fn from(access: Access) -> Self {
        match access {
            Access::Read => Kind::Read,
            Access::Write => Kind::Write,
        }
    }
}

/// Only two reads may run in either order.
fn conflicts(a: Kind, b: Kind) -> bool {
    !(a == Kind::Read && b == Kind::Read)
}

/// What a use enqueued on the simulated device does: the buffer it touches and how.
#[derive(Debug)]
struct Touch {
    buffer: u32,
    kind: Kind,
}

impl Payload for Touch {
    /// The happens-before check: a use may run only after every conflicting use of its buffer enqueued
    /// before it, whichever streams they were on and whatever order the test advanced them in.
    fn before_execute(uses: &[sim::Use<Self>], id: usize) {
        let this = &uses[id];
        for (earlier_id, earlier) in uses[..id].iter().enumerate() {
            assert!(
                earlier.payload.buffer != this.payload.buffer
                    || !conflicts(earlier.payload.kind, this.payload.kind)
                    || earlier.executed,
                "race on buffer {}: use {id} ({:?} on stream {}) ran before use {earlier_id} ({:?} on stream {})",
                this.payload.buffer,
                this.payload.kind,
                this.stream,
                earlier.payload.kind,
                earlier.stream
            );
        }
    }
}

/// The shared simulated device, its uses touching the tracked buffers.
type Sim = sim::Sim<Touch>;

impl Sim {
    /// Enqueues a use of `buffer` on `stream`, as the buffers do between `prepare` and `record_use`.
    fn touch(&self, buffer: u32, stream: usize, kind: Kind) -> usize {
        self.enqueue(stream, Touch { buffer, kind })
    }

    /// Asserts that every use of `buffer` conflicting with `kind` has executed: what a host access of that
    /// kind (or, for `Free`, a release) must see.
    fn assert_host_ordered(&self, buffer: u32, kind: Kind, what: &str) {
        for (id, u) in self.uses().iter().enumerate() {
            assert!(
                u.payload.buffer != buffer || !conflicts(u.payload.kind, kind) || u.executed,
                "{what} on buffer {buffer} returned while use {id} ({:?} on stream {}) had not run",
                u.payload.kind,
                u.stream
            );
        }
    }
}

type T = Tracker<usize, usize>;

/// `prepare`, enqueue on the device, `record_use`: one use as a buffer performs it.
fn device_use(tracker: &mut T, sim: &Sim, buffer: u32, stream: usize, access: Access) -> usize {
    tracker.prepare(sim, &stream, access).unwrap();
    let id = sim.touch(buffer, stream, access.into());
    tracker.record_use(&stream, &sim.mark(stream), access);
    id
}
