//! The driver's objects as the safe layer holds them: [`Device`], [`Context`], [`Stream`] and [`Event`].
//!
//! In layers: `calls.rs` (the typed driver calls, on the error type only), then `device.rs`, `context.rs`,
//! `event.rs`, `marks.rs` (the segments of streams' work and their pooled events) and `stream.rs`, each using
//! only the files before it (ARCHITECTURE.md lists the layers; `scripts/check-layers.py` checks them).

pub(crate) mod calls;
pub(crate) mod context;
mod device;
mod event;
pub(crate) mod marks;
pub(crate) mod stream;

pub use context::{Context, DEVICE_MEMORY_KEPT};
pub use device::Device;
pub use event::Event;
pub(crate) use stream::Capture;
pub use stream::{Category, Stream};
