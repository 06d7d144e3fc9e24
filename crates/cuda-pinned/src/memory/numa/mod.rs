//! Where page-locked host memory lives on a host with several NUMA nodes.
//!
//! A copy between a GPU and pinned memory on the other socket's node crosses the inter-socket link, at a
//! fraction of the bandwidth of memory next to the GPU's PCIe root. The kernel places a page when it is first
//! touched or pinned, by the memory policy of the thread doing it, and the driver pins the pages of
//! `cuMemHostAlloc` in the calling thread. So memory is placed by allocating it on a helper thread whose
//! policy prefers the node (`place`); memory the crate maps itself can instead be bound before its first
//! touch ([`bind_range`]). The tests read where a page ended up (`node_of_address`).
//!
//! The topology comes from sysfs ([`Topology::read`]), whose root is an argument so that tests build fake
//! trees. Only Linux binds anything: elsewhere every placement resolves to "do not bind".

#![allow(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};

use crate::driver::Device;
use crate::error::{Error, Result};

/// Where the page-locked host memory of a buffer should live, on a host with several NUMA nodes (sockets, or
/// the sub-socket domains of NPS/SNC modes).
///
/// A transfer between a GPU and host memory is fastest when the memory is on the node the GPU is attached to;
/// memory on another node is reached across the inter-socket link. On a host with one node, for a device the
/// kernel reports no node for, and on systems other than Linux, every placement means [`Placement::Any`].
/// A placement prefers a node without requiring it: when the node has no free memory, the kernel takes pages
/// from another node rather than failing the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Placement {
    /// No binding: the operating system places the memory as it places any other (usually on the node of the
    /// CPU that first touches it).
    Any,
    /// The node of the GPU the memory is for, as the kernel reports it for the device's PCI address: the
    /// default. Where the system refuses to bind (a container without the right to set memory policies), the
    /// memory is allocated as for [`Placement::Any`].
    #[default]
    DeviceNode,
    /// An explicit node, such as the one the threads filling the buffer run on. Allocating fails with an
    /// error if the node is not online.
    Node(u32),
}

impl Placement {
    /// The NUMA node this placement puts page-locked memory for `device` on, on this host: `None` where it
    /// binds nothing (on a host of one node, for a device the kernel reports no node for, for
    /// [`Placement::Any`], and on systems other than Linux).
    ///
    /// # Errors
    /// For [`Placement::Node`], an invalid-argument error for a node that is not online or where the host's
    /// topology cannot be read from sysfs. [`Placement::DeviceNode`] gives `None` where its node cannot be
    /// read.
    pub fn node(self, device: Device) -> Result<Option<u32>> {
        node_for(self, device)
    }
}

/// The largest CPU or node number a list may hold: above any kernel's limits (8192 CPUs, 1024 nodes), and
/// low enough that a malformed list cannot ask for a huge allocation.
const MAX_ID: u32 = u16::MAX as u32;

/// The host's online NUMA nodes and their CPUs, as sysfs reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Topology {
    /// The sysfs root the topology was read from, where PCI devices are looked up.
    root: PathBuf,
    /// Each online node, ascending, with its CPUs (ascending; none for a node of memory only).
    nodes: Vec<(u32, Vec<u32>)>,
}

impl Topology {
    /// The topology of this host, from `/sys`.
    pub(crate) fn system() -> Result<Topology> {
        Topology::read(Path::new("/sys"))
    }

    /// The topology under the sysfs root `root`. A kernel without NUMA support has no
    /// `devices/system/node`: it reads as one node 0 holding every online CPU.
    ///
    /// # Errors
    /// An invalid-argument error naming the file, for a file that exists and cannot be read or parsed.
    pub(crate) fn read(root: &Path) -> Result<Topology> {
        let dir = root.join("devices/system/node");
        let cpus = |path: PathBuf| read_list(&path).map(Option::unwrap_or_default);
        let nodes = match read_list(&dir.join("online"))? {
            None => vec![(0, cpus(root.join("devices/system/cpu/online"))?)],
            Some(online) => {
                let node = |node| Ok((node, cpus(dir.join(format!("node{node}/cpulist")))?));
                online.into_iter().map(node).collect::<Result<_>>()?
            }
        };
        if nodes.is_empty() {
            let online = dir.join("online");
            return Err(Error::invalid(format!(
                "{} lists no NUMA node",
                online.display()
            )));
        }
        Ok(Topology {
            root: root.to_path_buf(),
            nodes,
        })
    }

    /// The online nodes, ascending.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes.iter().map(|(node, _)| *node)
    }

    /// The CPUs of `node`, ascending (none for a node of memory only), or `None` if it is not online.
    pub(crate) fn cpus(&self, node: u32) -> Option<&[u32]> {
        let at = self.nodes.binary_search_by_key(&node, |(n, _)| *n).ok()?;
        Some(&self.nodes[at].1)
    }

    /// The online node the PCI device `bus_id` is attached to, in `cuDeviceGetPCIBusId`'s spelling
    /// (`0000:1B:00.0`, the domain possibly of 8 digits); `None` when the kernel reports no node for it (-1),
    /// reports a node that is not online, or does not list the device (as in some virtual machines).
    ///
    /// # Errors
    /// An invalid-argument error for a malformed bus id or an unreadable or malformed `numa_node` file.
    pub(crate) fn device_node(&self, bus_id: &str) -> Result<Option<u32>> {
        let device = sysfs_pci_name(bus_id)?;
        let path = self
            .root
            .join(format!("bus/pci/devices/{device}/numa_node"));
        let Some(text) = read_sysfs(&path)? else {
            return Ok(None);
        };
        let Ok(node) = text.trim_end().parse::<i64>() else {
            let text = text.escape_debug();
            return Err(Error::invalid(format!(
                "{} holds `{text}`, not a node or -1",
                path.display()
            )));
        };
        Ok(u32::try_from(node)
            .ok()
            .filter(|&node| self.cpus(node).is_some()))
    }

    /// The node to place memory for the device `bus_id` on, or `None` to leave it to the system: always
    /// `None` on a host of one node and on systems other than Linux.
    ///
    /// # Errors
    /// An invalid-argument error for [`Placement::Node`] of a node that is not online, or when the device's
    /// node cannot be read (see [`Topology::device_node`]).
    pub(crate) fn resolve(
        &self,
        placement: Placement,
        bus_id: impl FnOnce() -> Result<String>,
    ) -> Result<Option<u32>> {
        if !cfg!(target_os = "linux") {
            return Ok(None);
        }
        if let Placement::Node(node) = placement
            && self.cpus(node).is_none()
        {
            let choose = "choose an online node, Placement::DeviceNode or Placement::Any";
            return Err(Error::invalid(format!(
                "{}; {choose}",
                not_online(node, self)
            )));
        }
        if self.nodes.len() < 2 {
            return Ok(None);
        }
        match placement {
            Placement::Any => Ok(None),
            Placement::Node(node) => Ok(Some(node)),
            Placement::DeviceNode => self.device_node(&bus_id()?),
        }
    }
}

/// This host's topology, read from `/sys` once (a node going on- or offline while the process runs is not
/// seen).
fn system_topology() -> Result<&'static Topology> {
    static SYSTEM: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
    if let Some(topology) = SYSTEM.get() {
        return Ok(topology);
    }
    let topology = Topology::system()?;
    Ok(SYSTEM.get_or_init(|| topology))
}

/// The node to place memory for `device` on, by `placement`, on this host; `None` to leave it to the system.
///
/// # Errors
/// For an explicit [`Placement::Node`], as [`Topology::resolve`]: [`Placement::DeviceNode`] resolves to `None`
/// where the topology, the device's PCI address or its node cannot be read.
pub(crate) fn node_for(placement: Placement, device: Device) -> Result<Option<u32>> {
    match (placement, system_topology()) {
        (Placement::Any, _) | (Placement::DeviceNode, Err(_)) => Ok(None),
        (_, topology) => node_in(topology?, placement, || device.pci_bus_id()),
    }
}

/// [`Topology::resolve`], except that the default, [`Placement::DeviceNode`], prefers the device's node
/// without requiring it: where the device's node cannot be read, the memory goes where the system puts it.
fn node_in(
    topology: &Topology,
    placement: Placement,
    bus_id: impl FnOnce() -> Result<String>,
) -> Result<Option<u32>> {
    match (placement, topology.resolve(placement, bus_id)) {
        (Placement::DeviceNode, Err(_)) => Ok(None),
        (_, node) => node,
    }
}

/// Runs `f`, which allocates (pins) page-locked memory for `device`, so that the memory lands where
/// `placement` says on this host (see [`place_in`]).
///
/// # Errors
/// As [`place_in`].
pub(crate) fn place<R: Send>(
    placement: Placement,
    device: Device,
    f: impl FnOnce() -> R + Send,
) -> Result<R> {
    match (placement, system_topology()) {
        (Placement::Any, _) | (Placement::DeviceNode, Err(_)) => Ok(f()),
        (_, topology) => place_in(topology?, placement, || device.pci_bus_id(), f),
    }
}

/// Runs `f`, which allocates (pins) page-locked memory for the device `bus_id` names, so that the memory
/// lands where `placement` says in `topology` ([`node_in`]): on the calling thread where there is nothing to
/// bind, else on a helper thread bound to the node ([`run_on_node`]). A binding the system refuses is an error
/// for an explicit [`Placement::Node`]; for [`Placement::DeviceNode`], the default, `f` runs unbound then, as
/// for [`Placement::Any`].
///
/// # Errors
/// For an explicit [`Placement::Node`], as [`Topology::resolve`] and `run_on_node`; `f` has not run then.
fn place_in<R: Send>(
    topology: &Topology,
    placement: Placement,
    bus_id: impl FnOnce() -> Result<String>,
    f: impl FnOnce() -> R + Send,
) -> Result<R> {
    match node_in(topology, placement, bus_id)? {
        None => Ok(f()),
        Some(node) => {
            let strict = matches!(placement, Placement::Node(_));
            run_on_node(node, topology, strict, f)
        }
    }
}

/// Makes the pages of `len` bytes at `ptr` (page-aligned, mapped, not touched yet) prefer the node
/// `placement` names for `device` when they are first touched. A binding the system refuses is an error only
/// for an explicit [`Placement::Node`], as in [`place`].
///
/// # Errors
/// As [`node_for`], and for an explicit node, as [`bind_range`].
pub(crate) fn bind_for(
    ptr: *mut u8,
    len: usize,
    placement: Placement,
    device: Device,
) -> Result<()> {
    let Some(node) = node_for(placement, device)? else {
        return Ok(());
    };
    match bind_range(ptr, len, node) {
        Err(e) if matches!(placement, Placement::Node(_)) => Err(e),
        _ => Ok(()),
    }
}

/// A file of sysfs as text, or `None` if it does not exist.
fn read_sysfs(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::invalid(format!("reading {}: {e}", path.display()))),
    }
}

/// A sysfs file in the list format (`0-3,8`), or `None` if it does not exist.
fn read_list(path: &Path) -> Result<Option<Vec<u32>>> {
    let context = |e: Error| e.context(format!("reading {}", path.display()));
    read_sysfs(path)?
        .map(|text| parse_list(&text).map_err(context))
        .transpose()
}

/// `text` as a number of at most `max_len` digits of `radix`, and nothing else (no sign, no blank).
fn number(text: &str, radix: u32, max_len: usize) -> Option<u32> {
    let digits = text.chars().all(|c| c.is_digit(radix));
    let number = u32::from_str_radix(text, radix).ok();
    number.filter(|_| digits && text.len() <= max_len)
}

/// The numbers of a list in the kernel's format for CPU and node sets (`0-3,8-11`: numbers and inclusive
/// ranges, separated by commas, optionally ending in a newline as sysfs writes it), ascending and without
/// duplicates. The empty list is the empty string.
///
/// # Errors
/// An invalid-argument error quoting the text, for anything else: blanks, signs, empty items, reversed
/// ranges, numbers above 65535.
pub(crate) fn parse_list(text: &str) -> Result<Vec<u32>> {
    let malformed = |why: String| {
        let text = text.escape_debug();
        Error::invalid(format!(
            "`{text}` is not a list of numbers and ranges such as `0-3,8` ({why})"
        ))
    };
    let id = |item: &str| match number(item, 10, 10) {
        Some(id) if id <= MAX_ID => Ok(id),
        Some(id) => Err(malformed(format!("{id} is above {MAX_ID}"))),
        None => Err(malformed(format!(
            "`{}` is not a number",
            item.escape_debug()
        ))),
    };
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let mut ranges = Vec::new();
    for item in body.split(',') {
        let (first, last) = item.split_once('-').unwrap_or((item, item));
        let (first, last) = (id(first)?, id(last)?);
        if first > last {
            return Err(malformed(format!(
                "the range {first}-{last} runs backwards"
            )));
        }
        ranges.push((first, last));
    }
    // Expanded once sorted, each number once, so that repeated ranges cannot make the list large.
    ranges.sort_unstable();
    let mut ids: Vec<u32> = Vec::new();
    for (first, last) in ranges {
        let from = ids
            .last()
            .map_or(first, |&top| first.max(top.saturating_add(1)));
        ids.extend(from..=last);
    }
    Ok(ids)
}

/// What is wrong with `node`, not online in `topology`.
fn not_online(node: u32, topology: &Topology) -> String {
    let online: Vec<u32> = topology.nodes().collect();
    format!("NUMA node {node} is not online (online: {online:?})")
}

/// The directory name sysfs gives the PCI device `bus_id` (`domain:bus:device.function` in hex, as the CUDA
/// driver spells it): the domain in at least 4 lower-case digits, the rest in 2, 2 and 1. Built from the
/// parsed numbers, so that no bus id names a path outside the devices directory.
fn sysfs_pci_name(bus_id: &str) -> Result<String> {
    let parse = || {
        let mut parts = bus_id.split(':');
        let (domain, bus, slot) = (parts.next()?, parts.next()?, parts.next()?);
        let (device, function) = slot.split_once('.')?;
        let (domain, bus) = (number(domain, 16, 8)?, number(bus, 16, 2)?);
        let (device, function) = (number(device, 16, 2)?, number(function, 16, 1)?);
        (parts.next().is_none() && device < 32 && function < 8)
            .then(|| format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
    };
    let bus_id = bus_id.escape_debug();
    let message = "is not a PCI bus id such as `0000:1B:00.0` (domain:bus:device.function, in hex)";
    parse().ok_or_else(|| Error::invalid(format!("`{bus_id}` {message}")))
}

/// Runs `f` on a helper thread bound to NUMA node `node` and returns its result: the thread runs on the
/// node's CPUs (where the calling thread may run when the node has none, or the process's cpuset holds none
/// of them) and its memory policy prefers the node, so that memory it first touches or pins lands there. The
/// settings end with the thread: the calling thread is left as it was. Anything per-thread that `f` needs,
/// such as the driver's current context, must be set inside `f`. A panic in `f` is resumed in the caller. On
/// systems other than Linux, `f` runs on the calling thread and nothing is bound.
///
/// # Errors
/// An invalid-argument error if `node` is not online in `topology`, if the thread cannot start, or if the
/// system refuses to bind it (naming the node, the call and the system's reason); `f` has not run then.
#[cfg(test)]
pub(crate) fn on_node<R: Send>(
    node: u32,
    topology: &Topology,
    f: impl FnOnce() -> R + Send,
) -> Result<R> {
    run_on_node(node, topology, true, f)
}

/// `on_node`, where a binding the system refuses is an error only if `strict`; otherwise `f` runs on the
/// helper thread unbound.
fn run_on_node<R: Send>(
    node: u32,
    topology: &Topology,
    strict: bool,
    f: impl FnOnce() -> R + Send,
) -> Result<R> {
    if !cfg!(target_os = "linux") {
        return Ok(f());
    }
    let Some(cpus) = topology.cpus(node) else {
        return Err(Error::invalid(not_online(node, topology)));
    };
    std::thread::scope(|scope| {
        let helper = std::thread::Builder::new()
            .name(format!("cuda-pinned-numa-{node}"))
            .spawn_scoped(scope, move || -> Result<R> {
                #[cfg(target_os = "linux")]
                match linux::bind_thread(node, cpus) {
                    Err(e) if strict => {
                        return Err(Error::invalid(format!(
                            "binding a thread to NUMA node {node}: {e}"
                        )));
                    }
                    _ => {}
                }
                #[cfg(not(target_os = "linux"))]
                let _ = cpus;
                Ok(f())
            })
            .map_err(|e| {
                let what = format!("starting a thread to allocate on NUMA node {node}: {e}");
                Error::invalid(format!(
                    "{what}; raise the process's thread limit or use Placement::Any"
                ))
            })?;
        helper
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Makes the pages of `len` bytes at `ptr` prefer NUMA node `node` when they are first touched; pages
/// already touched stay where they are. `ptr` must be page-aligned and the range mapped. Nothing on systems
/// other than Linux.
///
/// # Errors
/// An invalid-argument error naming the range, the node and the system's reason, when the system refuses.
#[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
pub(crate) fn bind_range(ptr: *mut u8, len: usize, node: u32) -> Result<()> {
    #[cfg(target_os = "linux")]
    linux::bind_range(ptr, len, node).map_err(|e| {
        Error::invalid(format!(
            "making {len} bytes at {ptr:p} prefer NUMA node {node}: {e}"
        ))
    })?;
    Ok(())
}

/// The NUMA node holding the page at `ptr`, mapping the page first if it was not (an untouched page of
/// anonymous memory then reads as the node of the kernel's shared zero page: write to it first); `None` on
/// systems other than Linux and on kernels without NUMA support.
///
/// # Errors
/// An invalid-argument error naming the address and the system's reason, as for an unmapped address.
#[cfg(test)]
#[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
pub(crate) fn node_of_address(ptr: *const u8) -> Result<Option<u32>> {
    #[cfg(target_os = "linux")]
    return match linux::policy(ptr, linux::MPOL_F_NODE | linux::MPOL_F_ADDR) {
        Ok((node, _)) => Ok(u32::try_from(node).ok()),
        Err(e) if e.error.raw_os_error() == Some(libc::ENOSYS) => Ok(None),
        Err(e) => Err(Error::invalid(format!(
            "asking the NUMA node of the page at {ptr:p}: {e}"
        ))),
    };
    #[cfg(not(target_os = "linux"))]
    Ok(None)
}

/// The system calls, through `libc::syscall`: glibc has no wrappers for the memory-policy calls (libnuma
/// has), and the affinity calls take masks of any length this way.
#[cfg(target_os = "linux")]
mod linux {
    use std::{fmt, io};

    #[cfg(test)]
    use libc::c_int;
    use libc::{c_long, c_ulong};

    /// `get_mempolicy`'s flags (linux/mempolicy.h), which libc lacks: the node holding a page rather than a
    /// policy, and the policy at an address rather than the thread's.
    #[cfg(test)]
    pub(super) const MPOL_F_NODE: c_int = 1;
    #[cfg(test)]
    pub(super) const MPOL_F_ADDR: c_int = 2;
    /// The arguments of the calls, as the `long`s `syscall` reads: the calling thread for a pid, the
    /// policy mode that prefers the nodes of its mask, no flags.
    const THIS_THREAD: c_long = 0;
    const PREFERRED: c_long = libc::MPOL_PREFERRED as c_long;
    const NO_FLAGS: c_long = 0;
    const BITS: usize = c_ulong::BITS as usize;
    /// The nodes of a mask read from the kernel: any kernel's `MAX_NUMNODES`.
    #[cfg(test)]
    const NODE_WORDS: usize = 1024 / BITS;

    /// A system call that failed: which, and the system's reason.
    #[derive(Debug)]
    pub(super) struct SysError {
        call: &'static str,
        pub(super) error: io::Error,
    }

    impl fmt::Display for SysError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} failed: {}", self.call, self.error)?;
            f.write_str(match self.error.raw_os_error() {
                Some(libc::EPERM) => {
                    "; container runtimes' default seccomp profiles allow the memory-policy calls only with \
                     CAP_SYS_NICE: grant it, or use Placement::Any"
                }
                Some(libc::ENOSYS) => "; the kernel has no NUMA support: use Placement::Any",
                _ => "",
            })
        }
    }

    /// The raw system call `call`'s result.
    fn check(call: &'static str, result: c_long) -> Result<(), SysError> {
        let error = (result < 0).then(io::Error::last_os_error);
        error.map_or(Ok(()), |error| Err(SysError { call, error }))
    }

    /// A bit mask of `ids` in the kernel's layout (bit `i` of word `i / BITS`).
    fn mask(ids: &[u32]) -> Vec<c_ulong> {
        let mut mask = vec![0; ids.iter().max().map_or(1, |&top| top as usize / BITS + 1)];
        for &id in ids {
            mask[id as usize / BITS] |= 1 << (id as usize % BITS);
        }
        mask
    }

    /// The ids set in `mask`, ascending.
    #[cfg(test)]
    fn ids(mask: &[c_ulong]) -> Vec<u32> {
        let set = |i: &usize| (mask[i / BITS] >> (i % BITS)) & 1 == 1;
        (0..mask.len() * BITS)
            .filter(set)
            .map(|i| i as u32)
            .collect()
    }

    /// The `maxnode` argument for `mask`: the kernel reads one bit fewer than it says.
    fn maxnode(mask: &[c_ulong]) -> c_ulong {
        (mask.len() * BITS + 1) as c_ulong
    }

    /// The CPUs the calling thread may run on.
    #[cfg(test)]
    pub(super) fn affinity() -> Result<Vec<u32>, SysError> {
        // The kernel wants a mask of at least its own CPU count, unknown here: grow until it fits.
        let mut mask: Vec<c_ulong> = vec![0; 16];
        loop {
            let (call, bytes) = (libc::SYS_sched_getaffinity, size_of_val(mask.as_slice()));
            // SAFETY: the kernel writes at most `bytes` bytes into `mask`, which holds that many.
            let result = unsafe { libc::syscall(call, THIS_THREAD, bytes, mask.as_mut_ptr()) };
            match check("sched_getaffinity", result) {
                Err(e) if e.error.raw_os_error() == Some(libc::EINVAL) && mask.len() < 1 << 12 => {
                    mask = vec![0; mask.len() * 2];
                }
                done => return done.map(|()| ids(&mask)),
            }
        }
    }

    /// Binds the calling thread to `node`, `cpus` being its CPUs: to run on them and with a memory policy
    /// preferring the node.
    pub(super) fn bind_thread(node: u32, cpus: &[u32]) -> Result<(), SysError> {
        if !cpus.is_empty() {
            let mask = mask(cpus);
            let (call, bytes) = (libc::SYS_sched_setaffinity, size_of_val(mask.as_slice()));
            // SAFETY: the kernel reads `bytes` bytes from `mask`, which holds that many; the affinity is the
            // calling thread's own.
            let result = unsafe { libc::syscall(call, THIS_THREAD, bytes, mask.as_ptr()) };
            match check("sched_setaffinity", result) {
                // The process's cpuset holds none of the CPUs: the thread stays where its caller may run.
                Err(e) if e.error.raw_os_error() == Some(libc::EINVAL) => {}
                done => done?,
            }
        }
        let mask = mask(&[node]);
        let (call, maxnode) = (libc::SYS_set_mempolicy, maxnode(&mask));
        // SAFETY: the kernel reads `maxnode - 1` bits from `mask`, its length; the policy is the calling
        // thread's own.
        let result = unsafe { libc::syscall(call, PREFERRED, mask.as_ptr(), maxnode) };
        check("set_mempolicy", result)
    }

    /// `mbind` of `len` bytes at `ptr`, preferring `node`.
    pub(super) fn bind_range(ptr: *mut u8, len: usize, node: u32) -> Result<(), SysError> {
        let mask = mask(&[node]);
        let (call, nodes, maxnode) = (libc::SYS_mbind, mask.as_ptr(), maxnode(&mask));
        // SAFETY: the kernel reads `maxnode - 1` bits from `mask`, its length. It checks the range itself (a
        // hole in it is an error) and changes where its pages will be allocated, never their contents; with
        // no flags it moves no page.
        let result = unsafe { libc::syscall(call, ptr, len, PREFERRED, nodes, maxnode, NO_FLAGS) };
        check("mbind", result)
    }

    /// `get_mempolicy` with `flags`, of the page at `at` under `MPOL_F_ADDR` (else of the calling thread):
    /// the mode (the node under `MPOL_F_NODE`) and the nodes of the policy.
    #[cfg(test)]
    pub(super) fn policy(at: *const u8, flags: c_int) -> Result<(c_int, Vec<u32>), SysError> {
        let (mut mode, mut mask): (c_int, Vec<c_ulong>) = (-1, vec![0; NODE_WORDS]);
        let (call, maxnode, flags) = (libc::SYS_get_mempolicy, maxnode(&mask), flags as c_ulong);
        // SAFETY: the kernel writes one int into `mode` and at most `maxnode - 1` bits, the length of `mask`,
        // into `mask`. Under MPOL_F_ADDR it looks `at` up in this process's mappings itself (an unmapped
        // address is an error) and at most maps the page for reading.
        let result =
            unsafe { libc::syscall(call, &raw mut mode, mask.as_mut_ptr(), maxnode, at, flags) };
        check("get_mempolicy", result).map(|()| (mode, ids(&mask)))
    }
}

#[cfg(test)]
mod tests;
