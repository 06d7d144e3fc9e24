//! The hand-over over a counter of sleepers that stays 0: a release never sees a sleeper to wake.

pub(crate) mod primitives {
    pub(crate) use super::super::loom_primitives::*;

    #[derive(Default)]
    pub(crate) struct AtomicUsize(loom::sync::atomic::AtomicUsize);

    impl AtomicUsize {
        pub(crate) fn load(&self, order: Ordering) -> usize {
            self.0.load(order)
        }
        pub(crate) fn compare_exchange(
            &self,
            current: usize,
            new: usize,
            success: Ordering,
            failure: Ordering,
        ) -> Result<usize, usize> {
            self.0.compare_exchange(current, new, success, failure)
        }
        pub(crate) fn swap(&self, value: usize, order: Ordering) -> usize {
            self.0.swap(value, order)
        }
        pub(crate) fn fetch_add(&self, _: usize, order: Ordering) -> usize {
            self.0.load(order)
        }
        pub(crate) fn fetch_sub(&self, _: usize, order: Ordering) -> usize {
            self.0.load(order)
        }
    }
}
#[path = "../reentrant.rs"]
#[allow(
    clippy::duplicate_mod,
    dead_code,
    reason = "the same protocol compiled over other primitives; the model uses part of it"
)]
pub(crate) mod reentrant;
