//! The enqueue gate of each device: every enqueue of the crate holds it for reading, with the stream's context
//! made current where needed; the release thread closes it (for writing) to see a device idle with nothing
//! being enqueued.

use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use super::super::device::Device;
use super::{Context, Current, DEVICES, lock};
use crate::error::Result;

thread_local! {
    /// How many gates the thread holds (see [`Context::enqueue_gate`]).
    static GATES_HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A device's gate held for reading by this thread (see [`Context::enqueue_gate`]).
pub(crate) struct Gate<'a> {
    _read: Option<RwLockReadGuard<'a, ()>>,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        GATES_HELD.set(GATES_HELD.get() - 1);
    }
}

/// Takes `gate` for reading, unless the thread holds a gate already (see [`Context::enqueue_gate`]).
pub(super) fn enter_gate(gate: &'static RwLock<()>) -> Gate<'static> {
    let held = GATES_HELD.get();
    GATES_HELD.set(held + 1);
    Gate {
        _read: (held == 0).then(|| gate.read().unwrap_or_else(PoisonError::into_inner)),
    }
}

/// Work being enqueued on a stream of a context: its device's gate held for reading, its context current (see
/// [`Context::enqueue`]).
pub(crate) struct Enqueue<'a> {
    _current: Option<Current<'a>>,
    _gate: Gate<'static>,
}

/// A device's gate held for writing by this thread (see [`Context::close_gate`]).
pub(crate) struct ClosedGate {
    _write: std::sync::RwLockWriteGuard<'static, ()>,
}

impl Drop for ClosedGate {
    fn drop(&mut self) {
        GATES_HELD.set(GATES_HELD.get() - 1);
    }
}

impl Context {
    /// Holds the device's gate for reading: taken by the crate's work while it enqueues, so that the release
    /// thread, which takes it for writing, never finds the device idle while work is about to be queued. A
    /// thread that holds it already (work enqueued inside [`crate::Stream::profile`], say) does not take it
    /// again: a second read could wait behind the release thread's write, which waits for the first.
    pub(crate) fn enqueue_gate(&self) -> Gate<'static> {
        enter_gate(self.0.gate)
    }

    /// What the crate holds while it enqueues work on a stream of this context: the device's gate for reading
    /// ([`Context::enqueue_gate`]) and the context current on the calling thread ([`Context::enter`]), both
    /// until the guard drops. Work the crate enqueues on a stream is enqueued with the stream's context
    /// current, whatever the thread had current before: the driver refuses a copy of memory from a device's
    /// memory pool on that device's stream while another device's context is current (unless the pool is open
    /// to that device), and a batched copy with none current (ARCHITECTURE.md, "The driver's rules about
    /// contexts"). Costs one driver call (a thread-local read) where the context is current already, a push
    /// and a pop more where not. Two kinds of work skip it where the rules allow: a plain copy on a machine
    /// whose only device is this one ([`Context::enqueue_copy`]) and a kernel launch through `cuLaunchKernel`
    /// ([`Context::enqueue_launch`]).
    ///
    /// # Errors
    /// The driver's, from making the context current.
    pub(crate) fn enqueue(&self) -> Result<Enqueue<'_>> {
        let current = self.enter()?;
        Ok(Enqueue {
            _current: Some(current),
            _gate: self.enqueue_gate(),
        })
    }

    /// [`Context::enqueue`] for a kernel launch through `cuLaunchKernel`, which the driver enqueues whatever
    /// context the calling thread has current (ARCHITECTURE.md, "The driver's rules about contexts"): only the
    /// gate. What the tracking itself may call meanwhile (recording and waiting for events) works in every state
    /// too, and making an event enters the context.
    pub(crate) fn enqueue_launch(&self) -> Enqueue<'_> {
        Enqueue {
            _current: None,
            _gate: self.enqueue_gate(),
        }
    }

    /// [`Context::enqueue`] for a plain copy (`cuMemcpyHtoDAsync`, `cuMemcpyDtoHAsync`, `cuMemcpyDtoDAsync`;
    /// not a batched one) on a stream of this context. The driver refuses such a copy of pool memory only
    /// while a context of another device is current (ARCHITECTURE.md, "The driver's rules about contexts": "A
    /// copy takes its device memory as seen from the thread's current context"). Where the process sees no other device, none can be: only the gate is taken, which saves
    /// reading the thread's context; else as [`Context::enqueue`].
    ///
    /// # Errors
    /// As [`Context::enqueue`].
    pub(crate) fn enqueue_copy(&self) -> Result<Enqueue<'_>> {
        if !self.0.sole_device {
            return self.enqueue();
        }
        Ok(Enqueue {
            _current: None,
            _gate: self.enqueue_gate(),
        })
    }

    /// Whether the calling thread holds a device's gate (see [`Context::enqueue_gate`]).
    pub(crate) fn holds_a_gate() -> bool {
        GATES_HELD.get() > 0
    }

    /// Holds the gate of `device` (see [`Context::enqueue_gate`]) for writing, if the crate has made a context
    /// on it and the gate comes free within 20 ms (`None` otherwise): no work of the crate is being
    /// enqueued on the device until the guard drops. The calling thread
    /// counts as holding a gate meanwhile, so that what it does under the guard (dropping a stream's last
    /// handle, say) does not try to take it for reading, which would never end.
    pub(crate) fn close_gate(device: Device) -> Option<ClosedGate> {
        let gate = lock(&DEVICES)
            .iter()
            .find(|d| d.device.ordinal() == device.ordinal())
            .map(|d| d.gate)?;
        // Never queued as a waiting writer: std's RwLock lets no new reader in while a writer waits, so a
        // thread enqueueing inside a user's closure (which holds the gate for reading) and waiting for another
        // thread's enqueue would hang. Readers hold the gate for an enqueue's length: polled for up to 20 ms
        // (the release thread's own time), it is free unless a user's closure holds it, and the caller tries
        // again in its next round.
        const PATIENCE: std::time::Duration = std::time::Duration::from_millis(20);
        let started = std::time::Instant::now();
        let write = loop {
            match gate.try_write() {
                Ok(write) => break write,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if started.elapsed() < PATIENCE => {
                    if started.elapsed() < std::time::Duration::from_micros(100) {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        };
        GATES_HELD.set(GATES_HELD.get() + 1);
        Some(ClosedGate { _write: write })
    }
}
