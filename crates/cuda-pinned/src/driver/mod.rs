//! The driver's objects as the safe layer holds them: [`Device`], [`Context`], [`Stream`] and [`Event`].

pub(crate) mod calls;
pub(crate) mod context;
mod device;
mod event;
pub(crate) mod marks;
pub(crate) mod stream;

pub use context::Context;
pub use device::Device;
pub use event::Event;
pub use stream::{Category, Stream};
