//! Futures of device work, for async code: [`Done`] (a stream's or an event's work), served by the process's one
//! reactor thread (`reactor.rs`), which reads the words of page-locked memory streams write as their work
//! completes (their bookkeeping: `sync/flags.rs`), and `Resolved`, the wrapper of the crate's other awaited
//! operations.

mod done;
mod reactor;

pub use done::Done;
pub(crate) use done::Resolved;
