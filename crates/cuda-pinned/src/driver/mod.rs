//! The driver's objects as the safe layer holds them: [`Device`], [`Context`], [`Stream`] and [`Event`].
//!
//! In layers: `primitives.rs` (the synchronization primitives of the crate's lock protocols), `reentrant.rs`
//! and `flags.rs` (those protocols, on the primitives only, model-checked by `model.rs`), `calls.rs` (the
//! typed driver calls, on the error type only), then `device.rs`, `context.rs`, `event.rs`, `marks.rs` (the
//! segments of streams' work and their pooled events), `stream.rs`, then `reactor.rs` (the thread that watches
//! device work for futures) and `done.rs` (the futures), each using only the files before it.

pub(crate) mod calls;
pub(crate) mod context;
mod device;
mod done;
mod event;
mod flags;
pub(crate) mod marks;
#[cfg(test)]
mod model;
pub(crate) mod primitives;
mod reactor;
mod reentrant;
pub(crate) mod stream;

pub use context::{Context, DEVICE_MEMORY_KEPT};
pub use device::Device;
pub use done::Done;
pub(crate) use done::Resolved;
pub use event::Event;
pub(crate) use stream::Capture;
pub use stream::{Category, Stream};
