//! Launches of users' kernels ([`Stream::launch`]) and other code's work declared on a stream
//! ([`Stream::enqueue_foreign`]), tracked as the crate's copies are.

#![allow(unsafe_code)]

use std::ffi::c_void;

use smallvec::SmallVec;

use super::args::{Arg, ArgKind, Place, Use};
use super::config::LaunchConfig;
use super::module::Kernel;
use crate::driver::{Category, Stream, calls};
use crate::error::{Error, Result};
use crate::memory::{INLINE, Track, Work};
use crate::sys::{CUdeviceptr, CUstream};
use crate::track::Access;

impl Stream {
    /// Enqueues `kernel` on this stream with `args`, after any conflicting work on its buffers from other
    /// streams (device-side waits), and records what it reads and writes: later work and host accessors wait
    /// for it, and its buffers are freed only once it has completed. Returns at once.
    ///
    /// # Errors
    /// An invalid-argument error, with nothing enqueued, for a kernel or buffer of another context, a number
    /// or size of arguments that differs from the kernel's parameters (where the driver tells them), or a
    /// grid, block or shared-memory size over the kernel's or device's limits; host memory that is not
    /// mapped; the driver's launch error.
    ///
    /// # Safety
    /// The kernel's parameters must have the types of `args`, in order (a buffer argument is a pointer to its
    /// element type), and the kernel must touch only the memory of its buffer arguments, within their bounds,
    /// writing only those passed with [`Arg::write`] / [`Arg::write_host`], and finish (no waiting on other
    /// work that could wait on it).
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[Arg<'_>],
    ) -> Result<()> {
        config.check(kernel)?;
        let context = self.context();
        let sizes = kernel.params.as_deref();
        if sizes.is_some_and(|sizes| sizes.len() != args.len())
            || kernel.module.context() != context
        {
            return Err(self.refuse_launch(kernel, args));
        }
        // One pass checks each argument, collects the buffers' uses and points each parameter at its value (a
        // value argument's bytes, a device buffer's address inside its `Arg`); host buffers' addresses are
        // looked up after. The uses and parameters stay on the stack for up to INLINE of each.
        //
        // The module is unloaded on the release thread, once the device is idle: no kernel of it runs then on a
        // stream the crate made, which the thread sees until its work is done even after its last handle drops.
        // A stream of other code's is seen only while a handle lives, so a launch there records a read of the
        // module, whose tracker then keeps the handle until the kernel has run.
        let mut uses: SmallVec<[(&Track, Access); INLINE]> = SmallVec::new();
        if !self.is_owned() {
            uses.push((&kernel.module.0.track, Access::Read));
        }
        let (mut inline_params, mut heap_params) = ([std::ptr::null_mut(); INLINE], Vec::new());
        let params: &mut [*mut c_void] = if args.len() <= INLINE {
            &mut inline_params[..args.len()]
        } else {
            heap_params.resize(args.len(), std::ptr::null_mut());
            &mut heap_params
        };
        let mut host = 0;
        for (index, (param, arg)) in params.iter_mut().zip(args).enumerate() {
            if sizes.is_some_and(|sizes| sizes[index] != arg.size()) {
                return Err(self.refuse_launch(kernel, args));
            }
            match &arg.0 {
                ArgKind::Value(bytes) => *param = bytes.as_ptr().cast_mut().cast(),
                ArgKind::Memory(used) => {
                    match &used.place {
                        Place::Device(address, owner) if *owner == context => {
                            *param = std::ptr::from_ref(address).cast_mut().cast();
                        }
                        Place::Host(_) => host += 1,
                        Place::Device(..) | Place::Module(_) => {
                            return Err(self.refuse_launch(kernel, args));
                        }
                    }
                    uses.push((used.track, used.access));
                }
            }
        }
        // Host memory's device address is looked up in the stream's context, into a list that does not move
        // once the parameters point into it.
        let mut host_addresses: SmallVec<[CUdeviceptr; 4]> = SmallVec::new();
        if host > 0 {
            let _current = context.enter()?;
            for arg in args {
                if let ArgKind::Memory(
                    used @ Use {
                        place: Place::Host(_),
                        ..
                    },
                ) = &arg.0
                {
                    host_addresses.push(used.address(&kernel.name)?);
                }
            }
            let mut next = host_addresses.iter();
            for (param, arg) in params.iter_mut().zip(args) {
                if let ArgKind::Memory(Use {
                    place: Place::Host(_),
                    ..
                }) = &arg.0
                {
                    let address = next.next().expect("one address per host buffer");
                    *param = std::ptr::from_ref(address).cast_mut().cast();
                }
            }
        }
        let work = Work::Timed(Category::Kernel, "kernel", 0);
        // What each parameter is, for a capture (`Graph::replace` moves only the pointers to the buffer it
        // replaces, and values); read only while the stream captures.
        let capturing = self.is_capturing();
        let kinds: SmallVec<[Option<usize>; INLINE]> = if capturing {
            args.iter()
                .map(|arg| match &arg.0 {
                    ArgKind::Value(_) => None,
                    ArgKind::Memory(used) => Some(used.track.key()),
                })
                .collect()
        } else {
            SmallVec::new()
        };
        let kinds = capturing.then_some(&kinds[..]);
        self.tracked_uses_holding(context.enqueue_launch(), work, &mut uses, kinds, || {
            // SAFETY: one pointer per parameter, each to a value of its size (checked against the driver's
            // parameter info where it has it) that outlives the call; the kernel's types and footprint are the
            // caller's promise; the trackers ordered the launch after conflicting work and keep its buffers
            // (and the module) alive until it completes; kernel and stream are of one context (checked).
            unsafe {
                calls::launch_kernel(
                    kernel.raw,
                    config.grid,
                    config.block,
                    config.shared_memory,
                    self.as_raw(),
                    params,
                )
            }
        })
        .map_err(|e| e.context(format_args!("launching `{}`", kernel.name)))
    }

    /// What [`Stream::launch`] found wrong with its kernel or arguments, as an error.
    #[cold]
    fn refuse_launch(&self, kernel: &Kernel, args: &[Arg<'_>]) -> Error {
        // Built only for a message: the happy path allocates nothing here.
        let what = || format!("launching `{}`", kernel.name);
        if kernel.module.context() != self.context() {
            return Error::invalid(format_args!(
                "{}: the kernel's module is loaded on device {} and the stream is of device {}; load it \
                 into the stream's context; nothing was enqueued",
                what(),
                kernel.module.context().device().ordinal(),
                self.context().device().ordinal()
            ));
        }
        if let Some(params) = &kernel.params {
            if params.len() != args.len() {
                return Error::invalid(format_args!(
                    "{}: {} arguments for {} parameters; nothing was enqueued",
                    what(),
                    args.len(),
                    params.len()
                ));
            }
            for (index, (arg, &size)) in args.iter().zip(params).enumerate() {
                if arg.size() != size {
                    return Error::invalid(format_args!(
                        "{}: argument {index} is {} bytes and the parameter {size}; nothing was enqueued",
                        what(),
                        arg.size()
                    ));
                }
            }
        }
        for (index, arg) in args.iter().enumerate() {
            if let ArgKind::Memory(used) = &arg.0 {
                if let Place::Module(_) = used.place {
                    return Error::invalid(format_args!(
                        "{}: argument {index} is a module, not a buffer (a launch of a kernel declares its module \
                         itself); nothing was enqueued",
                        what()
                    ));
                }
                if let Err(e) = used.check_context(self, what) {
                    return e;
                }
            }
        }
        Error::invalid(format_args!(
            "{}: the arguments do not match the kernel; nothing was enqueued",
            what()
        ))
    }

    /// Runs `enqueue`, which enqueues other code's work (a library call, a kernel launched through another
    /// crate) on this stream through its raw handle, and declares what that work reads and writes: it waits on
    /// the device for conflicting work of other streams first, and later work, host accessors and frees wait
    /// for it, exactly as for the crate's own copies. Returns `enqueue`'s value once it returns (the work
    /// itself runs on the device later).
    ///
    /// `enqueue` runs with the stream's context current on the calling thread (the thread's own, if any, is
    /// current again once this returns), so that calls taking their context from the thread find the stream's,
    /// and with no lock of the crate held: it may call the crate (the declared buffers are borrowed by `uses`,
    /// so only reads of those declared read). The uses are recorded once it returns, or
    /// unwinds: work it enqueued before a panic is waited for all the same. A [`Graph`](crate::Graph) that
    /// uses a declared buffer (without borrowing it) and whose launch would conflict with a declared use is
    /// refused with an `Err` until `enqueue` has returned, on any thread: where that work will stand on the
    /// stream is not known before. The uses are recorded even where
    /// `enqueue` enqueued nothing (it failed before its first call, say): the crate cannot tell, so later work
    /// on those buffers, their frees and host access then wait for this stream's work up to this point, which
    /// may be more than they needed (never less). A stream's ledger ([`Stream::with_ledger`]) does not time
    /// this work; wrap it in [`Stream::profile`] for that.
    ///
    /// # Errors
    /// An invalid-argument error, with `enqueue` not run, for device memory or a module of another context;
    /// the driver's, from ordering the work (`enqueue` is not run then, or, for an error while recording the
    /// order of what came before, nothing of it is lost: the uses are still recorded).
    ///
    /// # Safety
    /// The work `enqueue` enqueues must be on the stream it is given, and on no other stream; it must touch
    /// only the memory declared in `uses`, within its bounds, writing only what is declared written (and only
    /// valid values of the buffer's element type); it must finish on its own (not wait for work that waits for
    /// it, nor for a value or event nobody will write); and `enqueue` must not begin or end a stream capture
    /// (`cuStreamBeginCapture`), which would take the work off the stream while the crate counts on it. A
    /// kernel of a [`Module`](crate::Module) launched through its raw handle is declared with [`Use::module`], so that the
    /// module stays loaded until it has run.
    pub unsafe fn enqueue_foreign<R>(
        &self,
        uses: &[Use<'_>],
        enqueue: impl FnOnce(CUstream) -> R,
    ) -> Result<R> {
        for used in uses {
            used.check_context(self, || "declaring other code's work".into())?;
        }
        let mut tracks: SmallVec<[(&Track, Access); INLINE]> =
            uses.iter().map(|u| (u.track, u.access)).collect();
        self.declared(&mut tracks, || enqueue(self.as_raw()))
            .map_err(|e| e.context("declaring other code's work"))
    }
}
