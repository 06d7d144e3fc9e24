//! The simulated device's state: one process-wide lock over every allocation, stream, event and context, a
//! condition variable that wakes whoever waits for work to finish, the faults to inject and the violations
//! found. The driver functions in `api/` are thin wrappers over this.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::config::Config;
use crate::faults::Faults;
use crate::kernel::{Launch, StandIn};
use crate::sys::CUresult;

/// Whether each violation is printed on stderr as it is found (`cuda_sim_print_violations`): on, but while a
/// test that provokes violations on purpose checks them itself.
pub(crate) static PRINT_VIOLATIONS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

/// The one simulated driver of the process.
pub(crate) static SIM: LazyLock<Sim> = LazyLock::new(|| {
    let config = Config::read();
    let mut state = State::new();
    if let Some(spec) = &config.fail {
        state.bad_fail_spec = state.faults.add(spec).err();
    }
    Sim {
        state: Mutex::new(state),
        changed: Condvar::new(),
        config,
        workers: Mutex::new(Vec::new()),
    }
});

pub(crate) struct Sim {
    state: Mutex<State>,
    /// Notified whenever an operation completes, an event fires or memory is released.
    pub(crate) changed: Condvar,
    pub(crate) config: Config,
    /// The worker thread of each stream, by handle, until [`Sim::join_stopped`] joins it. Locked after
    /// `state`, never before.
    pub(crate) workers: Mutex<Vec<(usize, JoinHandle<()>)>>,
}

impl Sim {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug of the simulator; carry on so that the test reports it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the worker threads of streams that are gone (destroyed, their queues drained), so that none is
    /// still exiting when a test looks at what is left (a leak checker would see a thread's exit in flight as
    /// a leak).
    pub(crate) fn join_stopped(&self, state: &State) {
        let stopped: Vec<JoinHandle<()>> = {
            let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
            let (gone, running) = std::mem::take(&mut *workers)
                .into_iter()
                .partition(|(handle, _)| !state.streams.contains_key(handle));
            *workers = running;
            gone.into_iter().map(|(_, worker)| worker).collect()
        };
        for worker in stopped {
            // A worker that panicked has already reported it; the simulator goes on.
            let _ = worker.join();
        }
    }

    /// Waits on `changed` until `done(state)` holds; on a thread marked as an async executor's, reports the
    /// wait if there is one (see `detect.rs`).
    pub(crate) fn wait_until<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        mut done: impl FnMut(&mut State) -> bool,
    ) -> MutexGuard<'a, State> {
        if crate::detect::on_executor_thread() && !done(&mut state) {
            // The call waits (it is reported even if the work completes while its caller is named). Naming the
            // caller reads debug information: not under the lock, which every stream needs.
            drop(state);
            let callers = crate::detect::caller_frames();
            state = SIM.lock();
            state.finding(crate::detect::blocked_executor(&callers));
        }
        while !done(&mut state) {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state
    }
}

/// Device addresses start here: non-canonical on x86-64 and far from any host mapping, so a device pointer
/// used as a host pointer faults, and a host pointer passed as a device pointer is not found.
pub(crate) const DEVICE_BASE: u64 = 0xD000_0000_0000_0000;
/// Unused addresses left after each device allocation by default, so an overrun is not found inside the next
/// one ([`crate::Control::lay_device_allocations_end_to_end`] takes them away).
pub(crate) const DEVICE_GAP: u64 = 1 << 16;

/// What kind of memory an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cuMemAlloc_v2`.
    Device,
    /// `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`: usable only once its stream reaches the allocation.
    DeviceAsync,
    /// `cuMemHostAlloc` (or the runtime's `cudaHostAlloc`): memory the simulator owns.
    Pinned,
    /// `cuMemHostRegister_v2`: the caller's memory, page-locked as far as the simulator is concerned.
    Registered,
}

impl Kind {
    pub(crate) fn is_device(self) -> bool {
        matches!(self, Kind::Device | Kind::DeviceAsync)
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Kind::Device => "device memory",
            Kind::DeviceAsync => "stream-ordered device memory",
            Kind::Pinned => "pinned host memory",
            Kind::Registered => "registered host memory",
        }
    }
}

/// Memory the simulator allocated (device memory, pinned host memory), freed when dropped.
pub(crate) struct Storage {
    /// The block as allocated; the memory handed out starts `offset` bytes in.
    block: std::ptr::NonNull<u8>,
    offset: usize,
    layout: std::alloc::Layout,
}

// SAFETY: Storage is a uniquely owned heap block; moving it between threads moves only the ownership.
unsafe impl Send for Storage {}

/// The alignment the system allocator gives a zeroed block without zeroing it itself (`calloc`).
const CALLOC_ALIGN: usize = 16;

impl Storage {
    /// `bytes` of zeroed memory aligned to `align` (a power of two), or `None` where the host has none to give.
    /// The block is allocated at the system allocator's own alignment and aligned by hand: `alloc_zeroed` of
    /// a larger alignment writes every byte, where `calloc`'s fresh pages of a large block are zero already
    /// and cost nothing until touched (a simulated device can be filled without filling the host).
    pub(crate) fn zeroed(bytes: usize, align: usize) -> Option<Storage> {
        let size = bytes.max(1).checked_add(align.max(CALLOC_ALIGN))?;
        let layout = std::alloc::Layout::from_size_align(size, CALLOC_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let block = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        let offset = block.as_ptr().align_offset(align);
        if offset >= align.max(CALLOC_ALIGN) {
            // align_offset may decline to compute (it is allowed to): give up rather than overrun.
            // SAFETY: allocated just above with this layout.
            unsafe { std::alloc::dealloc(block.as_ptr(), layout) };
            return None;
        }
        Some(Storage {
            block,
            offset,
            layout,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.block.as_ptr().wrapping_add(self.offset)
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: the block came from alloc_zeroed with this layout in `zeroed` and is freed only here.
        unsafe { std::alloc::dealloc(self.block.as_ptr(), self.layout) }
    }
}

/// One allocation or registration.
pub(crate) struct Allocation {
    pub(crate) kind: Kind,
    /// The address the crate sees: a device address, or the host pointer.
    pub(crate) base: u64,
    pub(crate) bytes: usize,
    pub(crate) flags: u32,
    pub(crate) device: i32,
    /// The memory behind it, where the simulator owns it (all but `Registered`).
    pub(crate) storage: Option<Storage>,
    /// Queued operations (not yet finished) that touch it.
    pub(crate) pending: usize,
    /// Operations copying to or from it right now, outside the lock.
    pub(crate) executing: usize,
    /// For `DeviceAsync`: whether its stream has reached the allocation.
    pub(crate) ready: bool,
    /// Whether a stream-ordered free of it has been queued.
    pub(crate) free_queued: bool,
    /// The stream of that free (its handle; 0 for the default stream).
    pub(crate) free_stream: usize,
    /// For `DeviceAsync`: the memory pool it came from (its handle).
    pub(crate) pool: usize,
}

impl Allocation {
    /// The host address of byte `offset`.
    pub(crate) fn host_address(&self, offset: usize) -> *mut u8 {
        match &self.storage {
            Some(storage) => storage.as_ptr().wrapping_add(offset),
            None => (self.base as usize as *mut u8).wrapping_add(offset),
        }
    }
}

/// A place an operation reads or writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Loc {
    /// Inside a tracked allocation (device memory, pinned or registered host memory).
    Alloc { id: u64, offset: usize },
    /// Ordinary host memory: only ever used by operations that run in the caller's thread.
    Pageable(usize),
}

/// The host function of a `cuLaunchHostFunc`, with its argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostCall {
    pub(crate) f: unsafe extern "C" fn(*mut c_void),
    pub(crate) data: usize,
}

/// What a stream does, in order.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Copy {
        dst: Loc,
        src: Loc,
        bytes: usize,
    },
    Set {
        dst: Loc,
        value: u32,
        size: usize,
        count: usize,
    },
    Record {
        event: usize,
        generation: u64,
    },
    Wait {
        event: usize,
        generation: u64,
    },
    Host(HostCall),
    Allocate {
        id: u64,
    },
    Free {
        id: u64,
    },
    /// A kernel launch (`cuLaunchKernel`): its stand-in runs.
    Kernel(Arc<Launch>),
    /// A launch of an executable graph: its nodes run (`graph.rs`).
    Graph(Arc<crate::graph::GraphLaunch>),
}

impl Op {
    /// The allocations the operation touches: a kernel's are those that contained the value of an 8-byte
    /// parameter when it was launched (see [`Launch::allocations`]).
    pub(crate) fn allocations(&self) -> std::vec::IntoIter<u64> {
        let locs = match *self {
            Op::Copy { dst, src, .. } => [Some(dst), Some(src)],
            Op::Set { dst, .. } => [Some(dst), None],
            Op::Kernel(ref launch) => return launch.allocations.clone().into_iter(),
            Op::Graph(ref launch) => return launch.allocations().into_iter(),
            _ => [None, None],
        };
        let ids: Vec<u64> = locs
            .into_iter()
            .flatten()
            .filter_map(|loc| match loc {
                Loc::Alloc { id, .. } => Some(id),
                Loc::Pageable(_) => None,
            })
            .collect();
        ids.into_iter()
    }

    /// The allocations the operation touches or makes, for the false-dependency detector: those of
    /// [`Op::allocations`], and the one a stream-ordered allocation or free concerns.
    pub(crate) fn footprint(&self) -> Vec<u64> {
        match *self {
            Op::Allocate { id } | Op::Free { id } => vec![id],
            _ => self.allocations().collect(),
        }
    }

    /// Whether the operation is work (rather than an event record or wait, which take no time of their own).
    pub(crate) fn is_work(&self) -> bool {
        !matches!(self, Op::Record { .. } | Op::Wait { .. })
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Op::Copy { bytes, .. } => format!("a copy of {bytes} bytes"),
            Op::Set { count, size, .. } => format!("a memset of {count} x {size} bytes"),
            Op::Record { .. } => "an event record".into(),
            Op::Wait { .. } => "an event wait".into(),
            Op::Host(_) => "a host function".into(),
            Op::Allocate { .. } => "a stream-ordered allocation".into(),
            Op::Free { .. } => "a stream-ordered free".into(),
            Op::Kernel(launch) => format!("kernel `{}`", launch.kernel.name()),
            Op::Graph(launch) => format!("a graph of {} nodes", launch.nodes.len()),
        }
    }
}

pub(crate) struct StreamData {
    pub(crate) device: i32,
    pub(crate) flags: u32,
    pub(crate) priority: i32,
    /// Operations not yet finished; the front one may be running.
    pub(crate) queue: VecDeque<Op>,
    /// Destroyed by the crate: the handle is invalid, the worker finishes the queue and ends.
    pub(crate) destroyed: bool,
    /// Work on other streams this stream was made to wait for since its last operation that touches memory
    /// (see `detect.rs`).
    pub(crate) depends: Vec<Dependency>,
    /// The capture the stream is in, if any (`graph.rs`).
    pub(crate) capture: Option<crate::graph::Link>,
}

/// Queued work on another stream that a stream was made to wait for (`cuStreamWaitEvent`): the last work
/// ahead of the event's record.
pub(crate) struct Dependency {
    /// The stream the work is queued on.
    pub(crate) stream: usize,
    /// The work and the memory it touches, described when the wait was made (the memory may go later).
    pub(crate) work: String,
    /// The allocations it touches or makes (none for a host function).
    pub(crate) allocations: Vec<u64>,
    /// The stack of the `cuStreamWaitEvent` call, named only if the wait is reported.
    pub(crate) waited_from: std::backtrace::Backtrace,
    /// The thread that made the wait: only an operation of the same thread can be what it was made for.
    pub(crate) thread: std::thread::ThreadId,
}

pub(crate) struct EventData {
    /// The device of the context it was created in.
    pub(crate) device: i32,
    pub(crate) timing: bool,
    /// Records queued so far; a record's generation is the count when it was queued.
    pub(crate) recorded: u64,
    /// The generations recorded and not fired yet: records of one event on several streams fire in any order,
    /// and a wait or a query is about one record, not the highest.
    pub(crate) pending: std::collections::BTreeSet<u64>,
    /// When the latest record fired.
    pub(crate) time: Option<Instant>,
    pub(crate) destroyed: bool,
    /// Queued operations that name it.
    pub(crate) refs: usize,
    /// Where its latest record was made in a capture: the capture and the nodes it stands for.
    pub(crate) captured: Option<(usize, Vec<usize>)>,
}

/// A loaded module (`cuModuleLoadData`).
pub(crate) struct ModuleData {
    /// The device of the context it was loaded into.
    pub(crate) device: i32,
    /// The functions got from it so far, by name: the same name gives the same handle.
    pub(crate) functions: HashMap<Vec<u8>, usize>,
}

/// A function of a module (`cuModuleGetFunction`).
pub(crate) struct FunctionData {
    pub(crate) module: usize,
    pub(crate) device: i32,
    /// The stand-in registered under its name when it was got.
    pub(crate) kernel: Arc<StandIn>,
}

/// A device's primary context.
#[derive(Default)]
pub(crate) struct Primary {
    pub(crate) retained: u32,
    pub(crate) flags: u32,
    /// The devices whose memory this context was given access to (`cuCtxEnablePeerAccess`).
    pub(crate) peers: Vec<i32>,
}

pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) faults: Faults,
    /// What is wrong with `CUDA_SIM_FAIL`, if anything: `cuInit` fails rather than run without the faults.
    pub(crate) bad_fail_spec: Option<String>,
    /// Every violation found so far, in order.
    pub(crate) violations: Vec<String>,
    /// Calls that returned an error other than `CUDA_ERROR_NOT_READY` (what compute-sanitizer reports as API
    /// errors), as `function: CODE`.
    pub(crate) api_errors: Vec<String>,
    /// Whether the last violation still has to be returned as an error from a driver call.
    pub(crate) unreported: bool,
    pub(crate) allocations: HashMap<u64, Allocation>,
    /// Live device allocations by base address.
    pub(crate) device_map: BTreeMap<u64, u64>,
    /// Live pinned and registered host ranges by base address.
    pub(crate) host_map: BTreeMap<u64, u64>,
    pub(crate) next_id: u64,
    pub(crate) next_device_address: u64,
    /// The unused addresses left after each device allocation ([`DEVICE_GAP`], or none: a driver's
    /// allocations may lie end to end).
    pub(crate) device_gap: u64,
    pub(crate) pinned_used: usize,
    pub(crate) primaries: Vec<Primary>,
    pub(crate) streams: HashMap<usize, StreamData>,
    /// Operations each stream has finished, by handle.
    pub(crate) finished: HashMap<usize, u64>,
    pub(crate) events: HashMap<usize, EventData>,
    /// Loaded modules, by handle.
    pub(crate) modules: HashMap<usize, ModuleData>,
    /// Functions of loaded modules, by handle.
    pub(crate) functions: HashMap<usize, FunctionData>,
    pub(crate) next_handle: usize,
    /// Memory pools by handle: each device's default pool and those made with `cuMemPoolCreate`.
    pub(crate) pools: HashMap<usize, PoolData>,
    /// The handle of each device's default pool.
    pub(crate) default_pools: Vec<usize>,
    /// Contexts made with `cuCtxCreate_v4` and not destroyed, by handle: their devices.
    pub(crate) made_contexts: HashMap<usize, i32>,
    /// Devices whose context took a sticky error ([`State::fault`]), with it.
    pub(crate) faulted: HashMap<i32, CUresult>,
    /// Captures in progress, graphs and executable graphs, by handle (`graph.rs`).
    pub(crate) captures: HashMap<usize, crate::graph::CaptureData>,
    pub(crate) graphs: HashMap<usize, crate::graph::GraphData>,
    pub(crate) execs: HashMap<usize, crate::graph::ExecData>,
    /// The arrays of pointers to kernel nodes' parameters that `cuGraphKernelNodeGetParams_v2` handed out, by
    /// node, kept until the next call for the node or its graph's destruction.
    pub(crate) node_params: HashMap<usize, Vec<usize>>,
}

/// A memory pool: a device's default pool or one made with `cuMemPoolCreate`.
pub(crate) struct PoolData {
    pub(crate) device: i32,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub(crate) threshold: u64,
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`, on unless set off (as on the driver): an allocation
    /// may then reuse memory whose free is still pending on another stream by making its own stream wait.
    pub(crate) internal_dependencies: bool,
    /// The other devices given access to its memory (`cuMemPoolSetAccess`); its own device always has it.
    pub(crate) access: Vec<i32>,
    /// Whether `cuMemPoolDestroy` was called: no more allocations from it.
    pub(crate) destroyed: bool,
    /// Bytes of device memory freed back to the pool and still reserved by it. The driver maps it again for
    /// any allocation from the pool, of any size (a probe on an H100: 192 MiB freed in blocks of 64 MiB served
    /// an allocation of 128 MiB, and 72 GiB freed in blocks of 24 GiB one of 40 GiB, reserving nothing more),
    /// and the next synchronization returns what the pool holds above its release threshold.
    pub(crate) kept: usize,
}

impl PoolData {
    pub(crate) fn new(device: i32) -> PoolData {
        PoolData {
            device,
            threshold: 0,
            internal_dependencies: true,
            access: Vec::new(),
            destroyed: false,
            kept: 0,
        }
    }

    /// Returns kept memory to the device until the pool holds at most `keep` bytes with its live allocations
    /// (`live`), or keeps nothing.
    pub(crate) fn trim_to(&mut self, keep: u64, live: usize) {
        let room = usize::try_from(keep)
            .unwrap_or(usize::MAX)
            .saturating_sub(live);
        self.kept = self.kept.min(room);
    }
}

impl State {
    fn new() -> State {
        State {
            initialized: false,
            faults: Faults::default(),
            bad_fail_spec: None,
            violations: Vec::new(),
            api_errors: Vec::new(),
            unreported: false,
            allocations: HashMap::new(),
            device_map: BTreeMap::new(),
            host_map: BTreeMap::new(),
            next_id: 1,
            next_device_address: DEVICE_BASE,
            device_gap: DEVICE_GAP,
            pinned_used: 0,
            primaries: Vec::new(),
            streams: HashMap::new(),
            finished: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            pools: HashMap::new(),
            default_pools: Vec::new(),
            made_contexts: HashMap::new(),
            faulted: HashMap::new(),
            captures: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            node_params: HashMap::new(),
            next_handle: 0x5100,
        }
    }

    /// Records a violation: a log line now, an error from the next driver call.
    pub(crate) fn violation(&mut self, message: String) {
        self.finding(message);
        self.unreported = true;
    }

    /// Records a violation that costs time rather than correctness (a hidden wait, a false dependency): a log
    /// line and an entry in the list tests read, but no error from any driver call, since the work is right.
    pub(crate) fn finding(&mut self, message: String) {
        if PRINT_VIOLATIONS.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("cuda-pinned-sim: VIOLATION: {message}");
        }
        self.violations.push(message);
    }

    /// A fresh handle value for a stream, an event, a module or a function (never null, never reused).
    pub(crate) fn handle(&mut self) -> usize {
        self.next_handle += 0x10;
        self.next_handle
    }

    pub(crate) fn add_allocation(&mut self, allocation: Allocation) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        if allocation.kind.is_device() {
            self.device_map.insert(allocation.base, id);
        } else {
            if matches!(allocation.kind, Kind::Pinned | Kind::Registered) {
                self.pinned_used += allocation.bytes;
            }
            self.host_map.insert(allocation.base, id);
        }
        self.allocations.insert(id, allocation);
        id
    }

    /// Bytes of device memory allocated on `device`, with what its memory pools keep reserved.
    pub(crate) fn device_bytes(&self, device: i32) -> usize {
        let on_device = |a: &&Allocation| a.kind.is_device() && a.device == device;
        let allocated: usize = self
            .allocations
            .values()
            .filter(on_device)
            .map(|a| a.bytes)
            .sum();
        let kept: usize = self
            .pools
            .values()
            .filter(|p| p.device == device)
            .map(|p| p.kept)
            .sum();
        allocated + kept
    }

    /// Bytes of the live allocations of the pool with this handle.
    pub(crate) fn pool_live(&self, pool: usize) -> usize {
        self.allocations
            .values()
            .filter(|a| a.kind == Kind::DeviceAsync && a.pool == pool)
            .map(|a| a.bytes)
            .sum()
    }

    /// What the memory pools of `device` do at a synchronization there: return to the device the freed memory
    /// they keep above their release thresholds.
    pub(crate) fn release_above_thresholds(&mut self, device: i32) {
        let handles: Vec<usize> = self
            .pools
            .iter()
            .filter(|(_, pool)| pool.device == device)
            .map(|(&handle, _)| handle)
            .collect();
        for handle in handles {
            let live = self.pool_live(handle);
            let pool = self.pools.get_mut(&handle).expect("listed");
            let threshold = pool.threshold;
            pool.trim_to(threshold, live);
        }
    }

    /// The live allocation containing `[address, address + bytes)`, in the device or the host map.
    pub(crate) fn find(&self, address: u64, bytes: usize, device: bool) -> Option<(u64, usize)> {
        let map = if device {
            &self.device_map
        } else {
            &self.host_map
        };
        let (&base, &id) = map.range(..=address).next_back()?;
        let allocation = &self.allocations[&id];
        let offset = (address - base) as usize;
        let end = offset.checked_add(bytes)?;
        (end <= allocation.bytes).then_some((id, offset))
    }

    /// Removes an allocation from the address maps: later calls no longer find it, queued operations that
    /// touch it are violations. Its storage goes once nothing runs on it (the caller waits for that).
    pub(crate) fn unmap(&mut self, id: u64) {
        let Some(allocation) = self.allocations.get(&id) else {
            return;
        };
        let (kind, base, bytes, pool) = (
            allocation.kind,
            allocation.base,
            allocation.bytes,
            allocation.pool,
        );
        if kind.is_device() {
            self.device_map.remove(&base);
            // Freed into its pool, which keeps it reserved (a destroyed pool's goes back at once).
            if let Some(data) = self
                .pools
                .get_mut(&pool)
                .filter(|p| kind == Kind::DeviceAsync && !p.destroyed)
            {
                data.kept += bytes;
            }
        } else {
            self.host_map.remove(&base);
            if matches!(kind, Kind::Pinned | Kind::Registered) {
                self.pinned_used -= bytes;
            }
        }
        self.allocations.remove(&id);
    }

    /// The operations still queued anywhere that touch allocation `id`, described for a violation.
    pub(crate) fn users(&self, id: u64) -> String {
        let mut users = Vec::new();
        for (handle, stream) in &self.streams {
            for op in &stream.queue {
                if op.allocations().any(|a| a == id) {
                    users.push(format!("{} on stream {handle:#x}", op.describe()));
                }
            }
        }
        users.join(", ")
    }

    /// Whether every stream of `device` (only the blocking ones if `blocking_only`) has finished its queue.
    pub(crate) fn idle(&self, device: i32, blocking_only: bool) -> bool {
        self.streams.values().all(|s| {
            s.device != device
                || s.queue.is_empty()
                || (blocking_only
                    && s.flags & crate::sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0)
        })
    }

    /// Whether work on `device` may use allocation `id` directly: memory of its own device, pinned or
    /// registered host memory, memory of a peer's memory pool that it was given access to (`cuMemPoolSetAccess`),
    /// or other device memory of a peer whose context it may access (`cuCtxEnablePeerAccess`, which does not
    /// cover memory pools).
    pub(crate) fn accessible(&self, device: i32, id: u64) -> bool {
        let allocation = &self.allocations[&id];
        let owner = allocation.device;
        !allocation.kind.is_device()
            || owner == device
            || if allocation.kind == Kind::DeviceAsync {
                self.pools[&allocation.pool].access.contains(&device)
            } else {
                self.primaries[device as usize].peers.contains(&owner)
            }
    }

    /// Gives `device`'s context the sticky error `code`, as a kernel that traps does on the driver (a probe on
    /// 2 x H200, driver 580: after a trap, work queued behind it never runs, a `cuStreamWriteValue32_v2`
    /// queued behind it never lands, and every query of the context's streams and events returns
    /// `CUDA_ERROR_LAUNCH_FAILED` at once). From now on every call on its streams or events, and every call that
    /// needs it current, fails with `code`; the work queued on its streams is dropped without running (each
    /// stream's worker drains its queue), and the event records in it never fire. Waits already in progress for
    /// that work end, and fail.
    pub(crate) fn fault(&mut self, device: i32, code: CUresult) {
        self.faulted.insert(device, code);
    }

    /// Ends `device`'s sticky error, as resetting its primary context (`cuDevicePrimaryCtxReset`) lets a
    /// program go on: for tests that go on in the same process. The event records that were dropped count as
    /// fired, so that waits for them end.
    pub(crate) fn recover(&mut self, device: i32) {
        self.faulted.remove(&device);
        for event in self.events.values_mut().filter(|e| e.device == device) {
            event.pending.clear();
        }
    }

    /// `device`'s sticky error, if its context has one.
    pub(crate) fn sticky(&self, device: i32) -> Result<(), CUresult> {
        self.faulted.get(&device).map_or(Ok(()), |&code| Err(code))
    }

    /// The error a driver call returns for a violation not yet reported, once.
    pub(crate) fn take_unreported(&mut self) -> Option<CUresult> {
        std::mem::take(&mut self.unreported).then_some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
    }
}
