//! The file side of a load: opening a file for direct or buffered reads, asking whether the page cache holds
//! its bytes, and positional reads that deliver every byte they must or say which byte they could not.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::plan::Request;
use crate::error::{Error, Result};

/// Where a load's bytes come from: a file, or (in tests) a stand-in that fails on cue. Reads at an offset, from
/// any number of threads at once.
pub(crate) trait ReadAt: Sync {
    /// Reads into `buf` from byte `offset`, as `pread` does: the bytes read, 0 at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    #[cfg(unix)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }

    #[cfg(windows)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(self, buf, offset)
    }
}

/// A file opened for a load: always for buffered reads, and for direct ones where the system allows them.
pub(crate) struct Opened {
    pub(crate) path: PathBuf,
    pub(crate) buffered: File,
    /// The file opened with `O_DIRECT`, or why not.
    pub(crate) direct: std::result::Result<File, String>,
    /// Its length when opened.
    pub(crate) len: u64,
}

impl Opened {
    /// Opens `path`; for direct reads too if `direct` (else the reason says it was not asked for).
    ///
    /// # Errors
    /// [`Error::File`] if the file cannot be opened or is not a regular file.
    pub(crate) fn open(path: &Path, direct: bool) -> Result<Opened> {
        let buffered =
            File::open(path).map_err(|e| Error::file(path, 0, format_args!("cannot open: {e}")))?;
        let meta = buffered
            .metadata()
            .map_err(|e| Error::file(path, 0, format_args!("cannot read its length: {e}")))?;
        if !meta.is_file() {
            return Err(Error::file(path, 0, "not a regular file"));
        }
        let direct = if direct {
            open_direct(path)
        } else {
            Err("buffered reads were asked for".to_owned())
        };
        Ok(Opened {
            path: path.to_path_buf(),
            buffered,
            direct,
            len: meta.len(),
        })
    }
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> std::result::Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("the file system refused direct I/O (O_DIRECT: {e})"))
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_: &Path) -> std::result::Result<File, String> {
    Err("direct I/O is implemented on Linux only".to_owned())
}

/// The fraction of the pages of bytes `[start, end)` of `file` that the page cache holds (`mincore` of a
/// mapping of them, which reads nothing), or `None` where that cannot be asked.
#[cfg(target_os = "linux")]
pub(crate) fn resident_fraction(file: &File, start: u64, end: u64) -> Option<f64> {
    use std::os::fd::AsRawFd;
    const PAGE: u64 = 4096;
    let start = start - start % PAGE;
    let len = usize::try_from(end.checked_sub(start)?).ok()?;
    if len == 0 {
        return Some(1.0);
    }
    let offset = libc::off_t::try_from(start).ok()?;
    // SAFETY: a new read-only shared mapping of the file, never dereferenced: only its residency is asked.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset,
        )
    };
    if map == libc::MAP_FAILED {
        return None;
    }
    let pages = len.div_ceil(PAGE as usize);
    let mut resident = vec![0u8; pages];
    // SAFETY: `map` is a mapping of `len` bytes made above; `resident` has a byte per page of it.
    let asked = unsafe { libc::mincore(map, len, resident.as_mut_ptr()) };
    // SAFETY: unmaps the mapping made above, which nothing else refers to.
    unsafe { libc::munmap(map, len) };
    if asked != 0 {
        return None;
    }
    let held = resident.iter().filter(|&&page| page & 1 != 0).count();
    Some(held as f64 / pages as f64)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn resident_fraction(_: &File, _: u64, _: u64) -> Option<f64> {
    None
}

/// Reads `request` from `source` (the file at `path`) into `slot` (at least `request.len` bytes): every one of
/// its `needed` bytes, in as many reads as it takes.
///
/// # Errors
/// [`Error::File`] at the offset of a read that failed, or at the first missing byte if the file ends before
/// `needed` (it is shorter now than the load planned for: it shrank while being read).
pub(crate) fn read_request(
    source: &dyn ReadAt,
    path: &Path,
    slot: &mut [u8],
    request: &Request,
) -> Result<()> {
    let mut got = 0;
    while got < request.needed {
        let offset = request.offset + got as u64;
        match source.read_at(&mut slot[got..request.len], offset) {
            Ok(0) => {
                return Err(Error::file(
                    path,
                    offset,
                    format_args!(
                        "the file ends here, before the {} bytes to read from byte {} (it is shorter than \
                         when the load began: did it shrink while being read?)",
                        request.needed, request.offset
                    ),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::file(
                    path,
                    offset,
                    format_args!("reading {} bytes failed: {e}", request.len - got),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Delivers at most `step` bytes a read of a file of `len` bytes of value `offset % 251`.
    struct Trickle {
        len: u64,
        step: usize,
    }

    impl ReadAt for Trickle {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let n = buf
                .len()
                .min(self.step)
                .min(self.len.saturating_sub(offset) as usize);
            for (i, byte) in buf[..n].iter_mut().enumerate() {
                *byte = ((offset + i as u64) % 251) as u8;
            }
            Ok(n)
        }
    }

    fn request(offset: u64, len: usize, needed: usize) -> Request {
        Request {
            offset,
            len,
            needed,
            uploads: Vec::new(),
        }
    }

    #[test]
    fn short_reads_are_continued_until_every_needed_byte_is_in() {
        let source = Trickle {
            len: 10_000,
            step: 333,
        };
        let mut slot = vec![0u8; 8192];
        read_request(
            &source,
            Path::new("f"),
            &mut slot,
            &request(4096, 8192, 5000),
        )
        .unwrap();
        assert!(
            slot[..5000]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == ((4096 + i) % 251) as u8)
        );
    }

    #[test]
    fn a_file_that_ends_early_names_the_first_missing_byte() {
        let source = Trickle {
            len: 6000,
            step: 4096,
        };
        let mut slot = vec![0u8; 8192];
        let e = read_request(
            &source,
            Path::new("w.bin"),
            &mut slot,
            &request(4096, 8192, 5000),
        )
        .unwrap_err();
        assert!(matches!(e, Error::File { offset: 6000, .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("w.bin, at byte 6000: the file ends here"),
            "{e}"
        );
        // Control: long enough, the same request is read.
        let source = Trickle {
            len: 9096,
            step: 4096,
        };
        read_request(
            &source,
            Path::new("w.bin"),
            &mut slot,
            &request(4096, 8192, 5000),
        )
        .unwrap();
    }

    #[test]
    fn a_failing_read_names_its_offset_and_the_system_error() {
        struct Failing;
        impl ReadAt for Failing {
            fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<usize> {
                Err(io::Error::from_raw_os_error(5))
            }
        }
        let mut slot = vec![0u8; 4096];
        let e = read_request(
            &Failing,
            Path::new("x"),
            &mut slot,
            &request(8192, 4096, 100),
        )
        .unwrap_err();
        assert!(matches!(e, Error::File { offset: 8192, .. }), "{e:?}");
        assert!(e.to_string().contains("Input/output error"), "{e}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_page_cache_holds_a_file_just_written() {
        let path =
            std::env::temp_dir().join(format!("cuda-pinned-resident-{}", std::process::id()));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&vec![7u8; 1 << 20]))
            .unwrap();
        let opened = Opened::open(&path, false).unwrap();
        let held = resident_fraction(&opened.buffered, 0, opened.len).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(held > 0.9, "{held}");
        assert!(
            opened
                .direct
                .unwrap_err()
                .contains("buffered reads were asked for")
        );
    }

    #[test]
    fn opening_what_is_not_a_file_says_so() {
        let e = Opened::open(Path::new("/no/such/file"), true)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("/no/such/file, at byte 0: cannot open"),
            "{e}"
        );
        let e = Opened::open(&std::env::temp_dir(), true).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
