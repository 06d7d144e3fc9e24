//! The lending over words whose loads are all relaxed: reading a landed value orders nothing after it.

pub(crate) mod primitives {
    pub(crate) use super::super::loom_primitives::*;

    pub(crate) struct AtomicU32(loom::sync::atomic::AtomicU32);

    impl AtomicU32 {
        pub(crate) fn new(value: u32) -> AtomicU32 {
            AtomicU32(loom::sync::atomic::AtomicU32::new(value))
        }
        pub(crate) fn load(&self, _: Ordering) -> u32 {
            self.0.load(Ordering::Relaxed)
        }
        pub(crate) fn store(&self, value: u32, order: Ordering) {
            self.0.store(value, order);
        }
    }
}
#[path = "../flags.rs"]
#[allow(
    clippy::duplicate_mod,
    dead_code,
    reason = "the same protocol compiled over other primitives; the model uses part of it"
)]
pub(crate) mod flags;
