//! bring-up
#![deny(unsafe_op_in_unsafe_fn)]
pub mod error;
pub mod kernels;
pub mod sys;
pub use error::{Error, Result};
