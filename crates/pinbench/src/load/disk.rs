//! The file side of `pinbench load`: the safetensors file it writes (a header, then tensors of fresh bytes),
//! the page cache emptied of it or filled with it and asked how much of it it holds, the disk's own ceiling
//! (positional reads alone, as dd or fio make them), a mapping of the file, and the file system and disk the
//! file is on.

#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::Outcome;
use crate::timing::fill_pattern;

/// The page, and the alignment of a direct read's offset, length and buffer.
pub const PAGE: usize = 4096;
/// Elements of a row of every tensor.
const ROW_ELEMENTS: usize = 4096;
/// Bytes of a row: bf16 elements. Every tensor is whole rows, so the file's data is a multiple of this.
pub const ROW_BYTES: usize = ROW_ELEMENTS * 2;
/// The largest tensor: as a large language model's checkpoint has.
pub const MAX_TENSOR_BYTES: usize = 256 << 20;
/// The header's `__metadata__` says who wrote the file: a file that does not is never overwritten.
const WRITTEN_BY: &str = "pinbench load";
/// Bytes generated and written at a time.
const WRITE_CHUNK: usize = 64 << 20;

/// The tensors of the file: `tensors` of `tensor_bytes` (the last one the rest, no larger), bf16 of rows of
/// [`ROW_ELEMENTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of all tensors: a multiple of [`ROW_BYTES`].
    pub data_bytes: usize,
    pub tensor_bytes: usize,
    pub tensors: usize,
}

impl Layout {
    /// Tensors of [`MAX_TENSOR_BYTES`] for `data_bytes` (rounded down to whole rows, at least one); for data
    /// under 16 of them, 16 tensors of a 16th each, so a small file has many tensors too.
    #[must_use]
    pub fn new(data_bytes: usize) -> Layout {
        let data_bytes = (data_bytes - data_bytes % ROW_BYTES).max(ROW_BYTES);
        let sixteenth = data_bytes / 16;
        let tensor_bytes = (sixteenth - sixteenth % ROW_BYTES).clamp(ROW_BYTES, MAX_TENSOR_BYTES);
        Layout {
            data_bytes,
            tensor_bytes,
            tensors: data_bytes.div_ceil(tensor_bytes),
        }
    }

    /// Bytes of tensor `i`.
    fn tensor_len(&self, i: usize) -> usize {
        self.tensor_bytes
            .min(self.data_bytes - i * self.tensor_bytes)
    }

    /// The header's JSON for data of `seed`, padded with spaces to a multiple of 8 bytes (as the format's
    /// writers pad it). Its length is the same for every seed.
    #[must_use]
    pub fn header(&self, seed: u64) -> Vec<u8> {
        let mut map = Map::new();
        map.insert(
            "__metadata__".into(),
            json!({ "format": "pt", "written_by": WRITTEN_BY, "seed": format!("{seed:016x}") }),
        );
        let mut at = 0;
        for i in 0..self.tensors {
            let len = self.tensor_len(i);
            map.insert(
                format!("layers.{i:04}.weight"),
                json!({
                    "dtype": "BF16",
                    "shape": [len / ROW_BYTES, ROW_ELEMENTS],
                    "data_offsets": [at, at + len],
                }),
            );
            at += len;
        }
        let mut text = Value::Object(map).to_string().into_bytes();
        text.resize(text.len().next_multiple_of(8), b' ');
        text
    }

    /// Where the data starts in the file: after the header's length and the header.
    #[must_use]
    pub fn data_start(&self) -> u64 {
        8 + self.header(0).len() as u64
    }

    /// The file's length.
    #[must_use]
    pub fn file_bytes(&self) -> u64 {
        self.data_start() + self.data_bytes as u64
    }
}

/// What is at the file's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// Nothing.
    Missing,
    /// A file this mode wrote; `reusable` where it is the file of this layout.
    Ours { reusable: bool },
    /// Something else, never overwritten.
    Foreign(String),
}

/// What is at `path`, for a file of `layout`.
pub fn existing(path: &Path, layout: &Layout) -> Existing {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Existing::Missing,
        Err(e) => return Existing::Foreign(format!("cannot read its metadata: {e}")),
    };
    if !meta.is_file() {
        return Existing::Foreign("it is not a regular file".into());
    }
    let header = File::open(path).and_then(|mut file| {
        let mut length = [0u8; 8];
        file.read_exact(&mut length)?;
        let n = u64::from_le_bytes(length).min(1 << 20);
        let mut header = Vec::new();
        file.take(n).read_to_end(&mut header)?;
        Ok(header)
    });
    let header = match header {
        Ok(header) => header,
        Err(e) => return Existing::Foreign(format!("it has no safetensors header: {e}")),
    };
    let value: Option<Value> = serde_json::from_slice(&header).ok();
    let metadata = value.as_ref().and_then(|v| v.get("__metadata__"));
    if metadata
        .and_then(|m| m.get("written_by"))
        .and_then(Value::as_str)
        != Some(WRITTEN_BY)
    {
        return Existing::Foreign(format!(
            "its header does not say it was written by {WRITTEN_BY}"
        ));
    }
    let seed = metadata
        .and_then(|m| m.get("seed"))
        .and_then(Value::as_str)
        .and_then(|s| u64::from_str_radix(s, 16).ok());
    Existing::Ours {
        reusable: seed.is_some_and(|seed| layout.header(seed) == header)
            && meta.len() == layout.file_bytes(),
    }
}

/// Writes the file of `layout` at `path`: its header, then fresh bytes of `seed` generated on `threads`
/// threads, flushed to the disk. Returns the seconds it took.
///
/// # Errors
/// The system's, naming the file.
pub fn write(path: &Path, layout: &Layout, seed: u64, threads: usize) -> Outcome<f64> {
    let began = Instant::now();
    let failed = |e: io::Error| format!("writing {}: {e}", path.display());
    let mut file = File::create(path).map_err(failed)?;
    let header = layout.header(seed);
    file.write_all(&(header.len() as u64).to_le_bytes())
        .and_then(|()| file.write_all(&header))
        .map_err(failed)?;
    let mut chunk = vec![0u8; WRITE_CHUNK.min(layout.data_bytes)];
    let mut at = 0;
    while at < layout.data_bytes {
        let n = chunk.len().min(layout.data_bytes - at);
        fill(&mut chunk[..n], seed, at, threads);
        file.write_all(&chunk[..n]).map_err(failed)?;
        at += n;
    }
    file.sync_all().map_err(failed)?;
    Ok(began.elapsed().as_secs_f64())
}

/// Fills `bytes` (those at data byte `at`) with the pattern of `seed`, a part per thread, each seeded by
/// where it is.
fn fill(bytes: &mut [u8], seed: u64, at: usize, threads: usize) {
    let per = bytes
        .len()
        .div_ceil(threads.max(1))
        .next_multiple_of(8)
        .max(8);
    std::thread::scope(|scope| {
        for (k, part) in bytes.chunks_mut(per).enumerate() {
            let offset = (at + k * per) as u64;
            scope.spawn(move || fill_pattern(part, seed.rotate_left(17) ^ offset));
        }
    });
}

/// Writes the file's dirty pages to the disk (`fsync`), then asks the kernel to drop its pages from the page
/// cache (`posix_fadvise(POSIX_FADV_DONTNEED)`, which any user who can open the file may ask). Clean pages go
/// at once, unless a file system keeps them (tmpfs, whose pages are the file): [`resident_fraction`] tells.
///
/// # Errors
/// The system's.
pub fn drop_cached(path: &Path) -> Outcome<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: advice on an open file descriptor; it changes no memory of this process.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if advised != 0 {
        return Err(format!(
            "posix_fadvise(DONTNEED) of {}: {}",
            path.display(),
            io::Error::from_raw_os_error(advised)
        )
        .into());
    }
    Ok(())
}

/// The fraction of the file's pages the page cache holds: `mincore` of a mapping of the whole file, which
/// reads nothing.
///
/// # Errors
/// The system's.
pub fn resident_fraction(file: &File) -> Outcome<f64> {
    let len = usize::try_from(file.metadata()?.len())?;
    if len == 0 {
        return Ok(1.0);
    }
    let map = Mapped::new(file, len)?;
    let mut resident = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: `map` is a mapping of `len` bytes; `resident` has a byte per page of it.
    let asked = unsafe { libc::mincore(map.ptr, len, resident.as_mut_ptr()) };
    if asked != 0 {
        return Err(format!("mincore: {}", io::Error::last_os_error()).into());
    }
    let held = resident.iter().filter(|&&page| page & 1 != 0).count();
    Ok(held as f64 / resident.len() as f64)
}

/// A read-only shared mapping of a file, unmapped when dropped.
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    /// Maps the first `len` bytes of `file` (at least one).
    ///
    /// # Errors
    /// The system's.
    pub fn new(file: &File, len: usize) -> Outcome<Mapped> {
        // SAFETY: a new read-only mapping of an open file; nothing else refers to it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap of {len} bytes: {}", io::Error::last_os_error()).into());
        }
        Ok(Mapped { ptr, len })
    }

    /// The mapped bytes. The file is this mode's own, and nothing writes it while it is mapped.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` readable bytes mapped by `new`, alive until `self` drops; the file is not written or
        // truncated meanwhile (it is pinbench's own, and a read past a truncated end would fault, not lie).
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made by `new`, which no slice outlives (they borrow `self`).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Reads of the whole file, alone: how long they took and how they read.
#[derive(Debug, Clone, PartialEq)]
pub struct Reads {
    pub seconds: f64,
    pub bytes: u64,
    pub direct: bool,
    /// Why not direct, where direct reads were asked for and the file system refused them, or were not asked.
    pub why_buffered: Option<String>,
}

/// Reads the whole file at `path` on `readers` threads, each with a page-aligned buffer of `chunk` bytes
/// reading its own chunks of it (reader `t` chunks `t`, `t + readers`, ...): direct reads (`O_DIRECT`) if
/// `direct` and the file system takes them, else through the page cache. The wall time of the reads, the
/// buffers made before.
///
/// # Errors
/// The system's, naming the file and the offset; a file that ends early.
pub fn read_all(path: &Path, direct: bool, readers: usize, chunk: usize) -> Outcome<Reads> {
    let chunk = chunk.next_multiple_of(PAGE);
    let (file, why_buffered) = if direct {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(file) => (file, None),
            Err(e) => (
                File::open(path)?,
                Some(format!(
                    "the file system refused direct I/O (O_DIRECT: {e})"
                )),
            ),
        }
    } else {
        (
            File::open(path)?,
            Some("buffered reads were asked for".to_owned()),
        )
    };
    let direct = why_buffered.is_none();
    let len = file.metadata()?.len();
    let chunks = len.div_ceil(chunk as u64) as usize;
    let readers = readers.clamp(1, chunks.max(1));
    // Written once, so every page is there before the clock starts.
    let mut buffers: Vec<Vec<u8>> = (0..readers).map(|_| vec![1u8; chunk + PAGE]).collect();
    let began = Instant::now();
    std::thread::scope(|scope| -> Outcome<()> {
        let file = &file;
        let threads: Vec<_> = buffers
            .iter_mut()
            .enumerate()
            .map(|(t, buffer)| {
                scope.spawn(move || -> Result<(), String> {
                    let skip = buffer.as_ptr().align_offset(PAGE);
                    let buffer = &mut buffer[skip..skip + chunk];
                    for k in (t..chunks).step_by(readers) {
                        let offset = (k * chunk) as u64;
                        let want = chunk.min((len - offset) as usize);
                        // A direct read asks for whole pages; the file's end cuts the last one short.
                        let ask = if direct {
                            want.next_multiple_of(PAGE)
                        } else {
                            want
                        };
                        read_fully(file, &mut buffer[..ask], want, offset).map_err(|e| {
                            format!("reading {} at byte {offset}: {e}", path.display())
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        for thread in threads {
            thread.join().map_err(|_| "a reader thread panicked")??;
        }
        Ok(())
    })?;
    Ok(Reads {
        seconds: began.elapsed().as_secs_f64(),
        bytes: len,
        direct,
        why_buffered,
    })
}

/// Reads at least `want` bytes into `buffer` from `offset`, in as many reads as it takes.
fn read_fully(file: &File, buffer: &mut [u8], want: usize, offset: u64) -> io::Result<()> {
    let mut got = 0;
    while got < want {
        match file.read_at(&mut buffer[got..], offset + got as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the file ends {got} bytes in, before {want}"),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where the file is: its file system, as `/proc/mounts` lists the mount it is under, and the disk under that,
/// from sysfs. Each part `None` where it cannot be told.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Storage {
    pub mount_point: Option<String>,
    pub file_system: Option<String>,
    /// What is mounted: `/dev/nvme0n1p2`, or `overlay`, `tmpfs`.
    pub source: Option<String>,
    pub disk: Option<Disk>,
}

/// A block device, as `/sys/block/<name>` describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Disk {
    /// `nvme0n1`, `sda`, `dm-0`.
    pub name: String,
    /// `/sys/block/<name>/queue/rotational`: a spinning disk (`true`), or not.
    pub rotational: Option<bool>,
    /// `/sys/block/<name>/device/model`.
    pub model: Option<String>,
}

/// The storage of the file at `path`, best effort.
#[must_use]
pub fn storage(path: &Path) -> Storage {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mount = mount_of(&mounts, &path);
    // The disk: the block device of the file's st_dev where it has one (a partition's disk is its parent in
    // sysfs), else the device the mount names.
    let by_dev = std::fs::metadata(&path).ok().and_then(|meta| {
        let dev = meta.dev();
        let (major, minor) = (
            ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
            (dev & 0xff) | ((dev >> 12) & !0xff),
        );
        std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()
    });
    let by_source = mount
        .as_ref()
        .filter(|m| m.2.starts_with("/dev/"))
        .and_then(|m| std::fs::canonicalize(&m.2).ok())
        .and_then(|dev| Some(PathBuf::from("/sys/class/block").join(dev.file_name()?)))
        .and_then(|sys| std::fs::canonicalize(sys).ok());
    let disk = by_dev.or(by_source).and_then(|sys| {
        let sys = if sys.join("partition").exists() {
            sys.parent()?.to_path_buf()
        } else {
            sys
        };
        let name = sys.file_name()?.to_string_lossy().into_owned();
        let read = |file: &str| {
            std::fs::read_to_string(Path::new("/sys/block").join(&name).join(file))
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        };
        Some(Disk {
            rotational: read("queue/rotational").map(|r| r == "1"),
            model: read("device/model"),
            name,
        })
    });
    let (mount_point, file_system, source) = match mount {
        Some((point, fs, source)) => (Some(point), Some(fs), Some(source)),
        None => (None, None, None),
    };
    Storage {
        mount_point,
        file_system,
        source,
        disk,
    }
}

/// The mount of `/proc/mounts` (`mounts`) that `path` is under: the one of the longest mount point, the last
/// listed of equal ones (a later mount hides an earlier one). (mount point, file system, source).
fn mount_of(mounts: &str, path: &Path) -> Option<(String, String, String)> {
    let mut best: Option<(String, String, String)> = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [source, point, fs, ..] = fields[..] else {
            continue;
        };
        let point = unescape(point);
        if path.starts_with(&point) && best.as_ref().is_none_or(|b| point.len() >= b.0.len()) {
            best = Some((point, fs.to_owned(), unescape(source)));
        }
    }
    best
}

/// A field of `/proc/mounts`, whose spaces, tabs, newlines and backslashes are written as octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use cuda_pinned::load::SafeTensorsFile;

    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("pinbench-load-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn layouts_are_whole_rows_of_many_tensors() {
        let big = Layout::new(8 << 30);
        assert_eq!((big.tensor_bytes, big.tensors), (256 << 20, 32));
        let quick = Layout::new(1 << 30);
        assert_eq!((quick.tensor_bytes, quick.tensors), (64 << 20, 16));
        // 0.05 GiB: rounded down to rows; the last tensor takes the rest.
        let odd = Layout::new((0.05 * (1u64 << 30) as f64) as usize);
        assert_eq!(odd.data_bytes % ROW_BYTES, 0);
        assert_eq!(odd.tensors, 17);
        assert!(odd.tensor_len(16) > 0 && odd.tensor_len(16) < odd.tensor_bytes);
        let tiny = Layout::new(1);
        assert_eq!((tiny.data_bytes, tiny.tensors), (ROW_BYTES, 1));
        // The header's length does not depend on the seed, so the file's length is known before it is read.
        assert_eq!(odd.header(0).len(), odd.header(u64::MAX).len());
        assert_eq!(odd.header(0).len() % 8, 0);
    }

    #[test]
    fn the_file_written_is_a_safetensors_file_of_the_layout_and_is_recognised() {
        let path = temp("written");
        let layout = Layout::new(3 << 20);
        assert_eq!(existing(&path, &layout), Existing::Missing);
        write(&path, &layout, 7, 3).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), layout.file_bytes());
        let file = SafeTensorsFile::open(&path).unwrap();
        assert_eq!(file.tensors().len(), layout.tensors);
        let first = &file.tensors()[0];
        assert_eq!(
            first.shape(),
            [layout.tensor_bytes / ROW_BYTES, ROW_ELEMENTS]
        );
        assert_eq!(first.file_range().start, layout.data_start());
        assert_eq!(
            file.metadata()
                .unwrap()
                .get("written_by")
                .map(String::as_str),
            Some(WRITTEN_BY)
        );
        assert_eq!(existing(&path, &layout), Existing::Ours { reusable: true });
        assert_eq!(
            existing(&path, &Layout::new(4 << 20)),
            Existing::Ours { reusable: false }
        );
        // Fresh bytes: no two rows alike, none all zero.
        let bytes = std::fs::read(&path).unwrap();
        let data = &bytes[layout.data_start() as usize..];
        let rows: std::collections::HashSet<&[u8]> = data.chunks(ROW_BYTES).collect();
        assert_eq!(rows.len(), layout.data_bytes / ROW_BYTES);
        // Reads alone, direct (where this file system takes them) and buffered, read every byte.
        for direct in [true, false] {
            let reads = read_all(&path, direct, 3, 64 << 10).unwrap();
            assert_eq!(reads.bytes, layout.file_bytes());
            assert_eq!(reads.direct, direct && reads.why_buffered.is_none());
        }
        drop_cached(&path).unwrap();
        let file = File::open(&path).unwrap();
        let held = resident_fraction(&file).unwrap();
        assert!((0.0..=1.0).contains(&held), "{held}");
        assert_eq!(
            Mapped::new(&file, bytes.len()).unwrap().as_slice(),
            &bytes[..]
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_file_pinbench_did_not_write_is_never_taken_for_its_own() {
        let path = temp("foreign");
        std::fs::write(&path, b"not a checkpoint").unwrap();
        let layout = Layout::new(1 << 20);
        assert!(matches!(existing(&path, &layout), Existing::Foreign(_)));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            existing(&std::env::temp_dir(), &layout),
            Existing::Foreign(why) if why.contains("not a regular file")
        ));
    }

    #[test]
    fn the_mount_of_a_path_is_the_longest_mount_point_above_it() {
        let mounts = "/dev/vda / ext4 rw 0 0\n\
                      tmpfs /tmp tmpfs rw 0 0\n\
                      /dev/nvme0n1p1 /mnt/my\\040disk xfs rw 0 0\n\
                      /dev/sdb1 /tmp ext4 rw 0 0\n";
        let of = |p: &str| mount_of(mounts, Path::new(p)).map(|m| (m.0, m.1, m.2));
        assert_eq!(
            of("/home/x"),
            Some(("/".into(), "ext4".into(), "/dev/vda".into()))
        );
        // The later of two mounts on /tmp hides the earlier.
        assert_eq!(
            of("/tmp/a.safetensors"),
            Some(("/tmp".into(), "ext4".into(), "/dev/sdb1".into()))
        );
        assert_eq!(
            of("/mnt/my disk/f"),
            Some(("/mnt/my disk".into(), "xfs".into(), "/dev/nvme0n1p1".into()))
        );
        // A path component, not a prefix of the string: /tmpx is not under /tmp.
        assert_eq!(of("/tmpx/f").map(|m| m.0), Some("/".into()));
        assert_eq!(unescape("a\\011b\\\\c"), "a\tb\\\\c");
    }
}
