//! Host memory whose owner was dropped while device work still used it: kept in one process-wide list until
//! that work has completed, then released.
//!
//! The list is global rather than per context so that nothing but completed work ends an entry: dropping a
//! [`Context`] handle, or every handle of a primary context, must not release memory a copy still uses. Each
//! entry keeps a clone of its context, so the primary context (which owns pinned allocations) stays retained
//! until the memory is released.

use std::sync::{Arc, Mutex, PoisonError};

use super::{Bytes, Gpu};
use crate::context::Context;
use crate::error::Result;
use crate::event::Event;
use crate::stream::Stream;
use crate::track::Tracker;

/// Unpins and frees a block of host memory; run once, when no device work uses it.
pub(crate) type Release = Box<dyn FnOnce() -> Result<()> + Send>;

struct Pending {
    context: Context,
    track: Tracker<Stream, Arc<Event>>,
    release: Release,
    bytes: usize,
}

static PENDING: Mutex<Vec<Pending>> = Mutex::new(Vec::new());

/// Releases host memory now if no device work uses it, else keeps it until that work has completed (released
/// by the next [`release_idle`]). Never frees early: where the state of the work cannot be read, the memory is
/// leaked and the error kept for [`Context::check_deferred_errors`].
pub(crate) fn release_host(
    context: &Context,
    mut track: Tracker<Stream, Arc<Event>>,
    release: Release,
    bytes: usize,
) {
    let idle = context.enter().and_then(|_current| track.is_idle(&Gpu));
    match idle {
        Ok(true) => run(context, release, bytes),
        Ok(false) => {
            let pending = Pending {
                context: context.clone(),
                track,
                release,
                bytes,
            };
            PENDING
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(pending);
            release_idle();
        }
        Err(e) => {
            // Forgetting the release leaks the memory, and with it any Vec the closure owns: dropping the closure
            // would free memory a copy may still write.
            std::mem::forget(release);
            context.defer_error(e.context(format_args!(
                "releasing {} of pinned host memory (leaked)",
                Bytes(bytes)
            )));
        }
    }
}

/// Releases every kept block whose work has completed. Called when pinned memory is allocated or dropped and
/// by [`Context::synchronize`], so memory is held no longer than the next such call after its work ends.
pub(crate) fn release_idle() {
    let idle: Vec<Pending> = {
        let mut pending = PENDING.lock().unwrap_or_else(PoisonError::into_inner);
        let mut idle = Vec::new();
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            match p.context.enter().and_then(|_current| p.track.is_idle(&Gpu)) {
                Ok(true) => idle.push(pending.swap_remove(i)),
                Ok(false) => i += 1,
                Err(e) => {
                    // Whether its work is done cannot be known: keep it (a leak, never an early free).
                    p.context.defer_error(
                        e.context("checking whether pinned host memory may be released"),
                    );
                    i += 1;
                }
            }
        }
        idle
    };
    for p in idle {
        run(&p.context, p.release, p.bytes);
    }
}

fn run(context: &Context, release: Release, bytes: usize) {
    if let Err(e) = context.enter().and_then(|_current| release()) {
        context.defer_error(e.context(format_args!(
            "releasing {} of pinned host memory",
            Bytes(bytes)
        )));
    }
}
