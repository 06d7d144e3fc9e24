//! The NUMA placement's tests: the list parser, fake sysfs trees, and the calling thread's binding on this
//! host.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;

use super::*;

/// A bus id for [`Topology::resolve`].
fn bus(id: &str) -> impl FnOnce() -> Result<String> + '_ {
    move || Ok(id.to_owned())
}

/// Asserts that `result` is an error whose message holds `text`.
#[track_caller]
fn fails_with<T>(result: Result<T>, text: &str) {
    let error = result.err().map(|e| e.to_string());
    assert!(
        error.as_ref().is_some_and(|e| e.contains(text)),
        "{error:?} lacks {text:?}"
    );
}

#[test]
fn lists_parse() {
    let cases: [(&str, &[u32]); 7] = [
        ("", &[]),
        ("\n", &[]),
        ("0\n", &[0]),
        ("0-3,8-10\n", &[0, 1, 2, 3, 8, 9, 10]),
        ("5,1-2", &[1, 2, 5]),
        ("0-2,1-3,3", &[0, 1, 2, 3]),
        ("65535", &[65535]),
    ];
    for (text, ids) in cases {
        assert_eq!(parse_list(text).unwrap(), ids, "{text:?}");
    }
    let malformed = "0-|-1|1-0|a|0,,1|,0|0,| 0|0 |0-1-2|+1|0x1|1:2|0-3:2/4|0\n\n|\n0|\
                     65536|0-4294967295|99999999999|٣";
    for text in malformed.split('|') {
        fails_with(
            parse_list(text),
            &format!("`{}` is not a list", text.escape_debug()),
        );
    }
}

proptest! {
    #[test]
    fn any_text_parses_or_is_an_error(text in "[0-9,\\-\n ]{0,40}|\\PC{0,20}") {
        let _ = parse_list(&text);
    }

    #[test]
    fn lists_of_ranges_parse(ranges in proptest::collection::vec((0u32..300, 0u32..9), 0..20)) {
        let text: Vec<String> = ranges.iter().map(|(first, n)| format!("{first}-{}", first + n)).collect();
        let mut ids: Vec<u32> = ranges.iter().flat_map(|&(first, n)| first..=first + n).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(parse_list(&text.join(",")).unwrap(), ids);
    }
}

/// A sysfs tree in a directory of its own, removed when dropped.
struct FakeSysfs(PathBuf);

impl FakeSysfs {
    fn new(files: &[(&str, &str)]) -> FakeSysfs {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "cuda-pinned-numa-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let root = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&root).unwrap();
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        FakeSysfs(root)
    }

    /// Two nodes of 4 CPUs, devices on node 1 and on none, and the files of `extra`.
    fn two_nodes(extra: &[(&str, &str)]) -> FakeSysfs {
        let mut files = vec![
            ("devices/system/node/online", "0-1\n"),
            ("devices/system/node/node0/cpulist", "0-3\n"),
            ("devices/system/node/node1/cpulist", "4-7\n"),
            ("bus/pci/devices/0000:1b:00.0/numa_node", "1\n"),
            ("bus/pci/devices/0000:3d:00.0/numa_node", "-1\n"),
            ("bus/pci/devices/10000:01:1f.7/numa_node", "1\n"),
        ];
        files.extend_from_slice(extra);
        FakeSysfs::new(&files)
    }

    fn topology(&self) -> Result<Topology> {
        Topology::read(&self.0)
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(target_os = "linux")]
#[test]
fn placements_resolve_on_two_nodes() {
    let sysfs = FakeSysfs::two_nodes(&[("bus/pci/devices/0000:5e:00.0/numa_node", "3\n")]);
    let topology = sysfs.topology().unwrap();
    assert_eq!(topology.nodes().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(
        (topology.cpus(1), topology.cpus(2)),
        (Some(&[4, 5, 6, 7][..]), None)
    );
    let device = |bus_id: &str| topology.resolve(Placement::DeviceNode, || Ok(bus_id.into()));
    // On node 1, in every spelling; on no node, a node that is not online, a device sysfs does not list.
    for bus_id in [
        "0000:1B:00.0",
        "00000000:1b:00.0",
        "0000:1b:00.0",
        "00010000:01:1F.7",
    ] {
        assert_eq!(device(bus_id).unwrap(), Some(1), "{bus_id}");
    }
    for bus_id in ["0000:3D:00.0", "0000:5E:00.0", "0000:AF:00.0"] {
        assert_eq!(device(bus_id).unwrap(), None, "{bus_id}");
    }
    let malformed = "|../../x|0000:1b:00|0000:1g:00.0|0000:1b:00.0:0|0000:1b:20.0|0000:1b:00.8|\
                     000000000:1b:00.0|0000:01b:00.0|0000:1b:00.0/../..|0000:1b:+0.0";
    for bus_id in malformed.split('|') {
        fails_with(device(bus_id), "is not a PCI bus id such as `0000:1B:00.0`");
    }
    assert_eq!(
        topology
            .resolve(Placement::Any, bus("0000:1b:00.0"))
            .unwrap(),
        None
    );
    assert_eq!(
        topology.resolve(Placement::Node(0), bus("")).unwrap(),
        Some(0)
    );
    assert_eq!(
        topology.resolve(Placement::Node(1), bus("")).unwrap(),
        Some(1)
    );
    fails_with(
        topology.resolve(Placement::Node(5), bus("")),
        "node 5 is not online (online: [0, 1]); choose",
    );
}

#[test]
fn malformed_sysfs_files_are_errors() {
    let sysfs = FakeSysfs::two_nodes(&[("bus/pci/devices/0000:5e:00.0/numa_node", "one\n")]);
    fails_with(
        sysfs.topology().unwrap().device_node("0000:5e:00.0"),
        "numa_node holds `one\\n`",
    );
    let online = "devices/system/node/online";
    for (path, text) in [
        (online, "0-\n"),
        (online, ""),
        ("devices/system/node/node1/cpulist", "x"),
    ] {
        fails_with(FakeSysfs::two_nodes(&[(path, text)]).topology(), path);
    }
}

#[cfg(target_os = "linux")]
#[test]
fn one_node_hosts_bind_nothing() {
    let one = FakeSysfs::new(&[
        ("devices/system/node/online", "0\n"),
        ("devices/system/node/node0/cpulist", "0-1\n"),
        ("bus/pci/devices/0000:1b:00.0/numa_node", "0\n"),
    ]);
    let no_numa = FakeSysfs::new(&[("devices/system/cpu/online", "0-3\n")]);
    let empty = FakeSysfs::new(&[]);
    for (sysfs, cpus) in [(one, &[0, 1][..]), (no_numa, &[0, 1, 2, 3]), (empty, &[])] {
        let topology = sysfs.topology().unwrap();
        assert_eq!(
            (topology.nodes().collect(), topology.cpus(0)),
            (vec![0], Some(cpus))
        );
        for placement in [Placement::Any, Placement::DeviceNode, Placement::Node(0)] {
            assert_eq!(
                topology.resolve(placement, bus("0000:1b:00.0")).unwrap(),
                None,
                "{placement:?}"
            );
        }
        fails_with(
            topology.resolve(Placement::Node(1), bus("")),
            "node 1 is not online",
        );
    }
}

#[cfg(target_os = "linux")]
#[test]
fn on_node_of_a_node_not_online_runs_nothing() {
    let mut ran = false;
    let topology = FakeSysfs::two_nodes(&[]).topology().unwrap();
    fails_with(
        on_node(2, &topology, || ran = true),
        "node 2 is not online (online: [0, 1])",
    );
    assert!(!ran);
}

/// The calling thread: its id, its CPUs and its memory policy.
#[cfg(target_os = "linux")]
fn this_thread() -> (std::thread::ThreadId, Vec<u32>, (libc::c_int, Vec<u32>)) {
    let policy = linux::policy(std::ptr::null(), 0).unwrap();
    (
        std::thread::current().id(),
        linux::affinity().unwrap(),
        policy,
    )
}

#[cfg(target_os = "linux")]
#[test]
fn on_node_binds_its_own_thread() {
    let system = Topology::system().unwrap();
    let allowed = linux::affinity().unwrap();
    // Node 0 as one CPU, so that the binding shows where the inherited affinity would hold them all.
    let cpu = *system
        .cpus(0)
        .unwrap()
        .iter()
        .find(|cpu| allowed.contains(cpu))
        .unwrap();
    let topology = Topology {
        root: system.root,
        nodes: vec![(0, vec![cpu])],
    };
    let before = this_thread();
    let inside = on_node(0, &topology, this_thread).unwrap();
    assert_ne!(inside.0, before.0, "ran on the calling thread");
    assert_eq!(
        (inside.1, inside.2),
        (vec![cpu], (libc::MPOL_PREFERRED, vec![0]))
    );
    let after = this_thread();
    assert_eq!(after, before);
    assert_ne!(after.2.0, libc::MPOL_PREFERRED);
    // A node of CPUs outside the process's: the thread runs where its caller may, its memory still placed.
    let elsewhere = Topology {
        root: PathBuf::new(),
        nodes: vec![(0, vec![4095])],
    };
    let inside = on_node(0, &elsewhere, this_thread).unwrap();
    assert_eq!(
        (inside.1, inside.2),
        (before.1, (libc::MPOL_PREFERRED, vec![0]))
    );
    let panic = std::panic::catch_unwind(|| on_node(0, &topology, || panic!("inside")));
    assert_eq!(*panic.unwrap_err().downcast::<&str>().unwrap(), "inside");
}

/// Fresh anonymous memory: its start, its length and the length of a page.
#[cfg(target_os = "linux")]
struct Mapping(*mut u8, usize, usize);

#[cfg(target_os = "linux")]
impl Mapping {
    fn new(pages: usize) -> Mapping {
        // SAFETY: sysconf reads a constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let (len, null) = (pages * page, std::ptr::null_mut());
        let (access, kind) = (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        );
        // SAFETY: a new private anonymous mapping, where the kernel chooses, overlaps nothing.
        let ptr = unsafe { libc::mmap(null, len, access, kind, -1, 0) };
        assert_ne!(ptr, libc::MAP_FAILED);
        Mapping(ptr.cast(), len, page)
    }

    fn at(&self, offset: usize) -> *mut u8 {
        self.0.wrapping_add(offset)
    }
}

#[cfg(target_os = "linux")]
impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, whose pointers are not used after.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

#[cfg(target_os = "linux")]
#[test]
fn pages_touched_on_a_node_are_on_it() {
    let topology = Topology::system().unwrap();
    let (ptr, len) = on_node(0, &topology, || {
        let mapping = std::mem::ManuallyDrop::new(Mapping::new(4));
        // SAFETY: the mapping is `len` bytes, writable, and this test's alone.
        unsafe { std::ptr::write_bytes(mapping.0, 1, mapping.1) };
        (mapping.0 as usize, mapping.1)
    })
    .unwrap();
    let mapping = Mapping(ptr as *mut u8, len, 0);
    assert_eq!(node_of_address(mapping.at(0)).unwrap(), Some(0));
    assert_eq!(node_of_address(mapping.at(len - 1)).unwrap(), Some(0));
    // Page 0 is never mapped.
    fails_with(
        node_of_address(std::ptr::null()),
        "get_mempolicy failed: Bad address",
    );
}

#[cfg(target_os = "linux")]
#[test]
fn bound_ranges_prefer_their_node() {
    let mapping = Mapping::new(4);
    let page = mapping.2;
    let policy = |offset| linux::policy(mapping.at(offset), linux::MPOL_F_ADDR).unwrap();
    bind_range(mapping.at(page), 2 * page, 0).unwrap();
    assert_eq!(policy(page), (libc::MPOL_PREFERRED, vec![0]));
    assert_eq!(policy(3 * page - 1), (libc::MPOL_PREFERRED, vec![0]));
    assert_eq!(
        (policy(0).0, policy(3 * page).0),
        (libc::MPOL_DEFAULT, libc::MPOL_DEFAULT)
    );
    fails_with(
        bind_range(mapping.at(1), page, 0),
        "prefer NUMA node 0: mbind failed: Invalid argument",
    );
}

/// The allocators' placement on a host of two nodes (a fake tree whose node 0 is this host's): memory for a
/// device on node 0 is allocated on a thread bound to node 0, for one on no node on the calling thread; a
/// device on node 1, which this host lacks, makes the binding fail: an error for an explicit node, an
/// unbound allocation for the device's node (the default).
#[cfg(target_os = "linux")]
#[test]
fn allocations_run_where_the_placement_says() {
    let sysfs = FakeSysfs::new(&[
        ("devices/system/node/online", "0-1\n"),
        ("devices/system/node/node0/cpulist", "0\n"),
        ("devices/system/node/node1/cpulist", "\n"),
        ("bus/pci/devices/0000:1b:00.0/numa_node", "0\n"),
        ("bus/pci/devices/0000:3d:00.0/numa_node", "-1\n"),
        ("bus/pci/devices/0000:5e:00.0/numa_node", "1\n"),
    ]);
    let topology = sysfs.topology().unwrap();
    let caller = this_thread();
    let at = |placement, bus_id: &str| place_in(&topology, placement, bus(bus_id), this_thread);
    let bound = at(Placement::DeviceNode, "0000:1b:00.0").unwrap();
    assert_ne!(bound.0, caller.0, "allocated on the calling thread");
    assert_eq!(bound.2, (libc::MPOL_PREFERRED, vec![0]));
    assert_eq!(
        at(Placement::Node(0), "").unwrap().2,
        (libc::MPOL_PREFERRED, vec![0])
    );
    for unbound in [
        at(Placement::DeviceNode, "0000:3d:00.0"),
        at(Placement::Any, "0000:1b:00.0"),
    ] {
        assert_eq!(unbound.unwrap(), caller, "bound where nothing should be");
    }
    let refused = at(Placement::DeviceNode, "0000:5e:00.0").unwrap();
    assert_ne!(refused.2.0, libc::MPOL_PREFERRED);
    fails_with(at(Placement::Node(1), ""), "set_mempolicy");
    fails_with(at(Placement::Node(2), ""), "not online");
    // A device whose node cannot be read: the default allocates unbound, an explicit node is unaffected.
    let unreadable = || Err(Error::invalid("no PCI address"));
    let device_node = place_in(&topology, Placement::DeviceNode, unreadable, this_thread);
    assert_eq!(device_node.unwrap(), caller);
    assert!(place_in(&topology, Placement::Node(0), unreadable, this_thread).is_ok());
}
