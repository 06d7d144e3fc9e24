//! The protocols over loom's primitives.

pub(crate) mod primitives {
    pub(crate) use super::super::loom_primitives::*;
}
#[path = "../flags.rs"]
#[allow(
    clippy::duplicate_mod,
    dead_code,
    reason = "the same protocol compiled over other primitives; the model uses part of it"
)]
pub(crate) mod flags;
#[path = "../reentrant.rs"]
#[allow(
    clippy::duplicate_mod,
    dead_code,
    reason = "the same protocol compiled over other primitives; the model uses part of it"
)]
pub(crate) mod reentrant;
