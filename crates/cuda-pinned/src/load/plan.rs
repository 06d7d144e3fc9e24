//! Which reads a load makes: the byte ranges of a file that go to the device, cut into requests of at most one
//! slot each, aligned for direct I/O, each with the uploads that take its bytes from the slot to the device.
//!
//! Pure arithmetic, so that it is unit-tested and fuzzed (`fuzz/fuzz_targets/load.rs`) on its own.

use std::fmt;

/// The alignment of a direct read's offset, length and buffer: the largest logical block size of the disks
/// Linux drives (512 or 4096 bytes), so one value serves them all.
pub(crate) const DIRECT_ALIGN: u64 = 4096;

/// Bytes between two wanted ranges that a request reads rather than start a request of its own: a request costs
/// a system call and a round trip to the disk, and reading 64 KiB more costs less (tens of microseconds).
pub(crate) const MERGE_GAP: u64 = 64 << 10;

/// Bytes `[file, file + len)` of the file, which go to destination `dest` from its byte `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) file: u64,
    pub(crate) len: u64,
    pub(crate) dest: usize,
    pub(crate) at: u64,
}

/// One read into a slot: `len` bytes from file offset `offset` (both aligned for a direct read, so the read may
/// run past the end of the file, where it returns fewer), of which the first `needed` must arrive; then the
/// uploads out of the slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) needed: usize,
    pub(crate) uploads: Vec<Upload>,
}

/// `len` bytes of a slot from its byte `slot_at`, uploaded to destination `dest` at its byte `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Upload {
    pub(crate) slot_at: usize,
    pub(crate) dest: usize,
    pub(crate) at: u64,
    pub(crate) len: usize,
}

/// Why pieces cannot be planned: each names the file offset it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PlanError {
    /// Piece `index` ends past the file's end.
    PastEnd {
        index: usize,
        start: u64,
        end: u64,
        file_len: u64,
    },
    /// Piece `index` (not empty) starts before the end of the piece before it (pieces come in file order).
    Overlaps {
        index: usize,
        start: u64,
        previous_end: u64,
    },
    /// The slot cannot hold two aligned blocks.
    SlotTooSmall { slot_bytes: usize, align: u64 },
}

impl PlanError {
    /// The file offset the error is about.
    pub(crate) fn offset(&self) -> u64 {
        match *self {
            PlanError::PastEnd { start, .. } | PlanError::Overlaps { start, .. } => start,
            PlanError::SlotTooSmall { .. } => 0,
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PlanError::PastEnd {
                index,
                start,
                end,
                file_len,
            } => write!(
                f,
                "range {index} (bytes {start}..{end}) ends past the end of the file ({file_len} bytes)"
            ),
            PlanError::Overlaps {
                index,
                start,
                previous_end,
            } => write!(
                f,
                "range {index} starts at byte {start}, inside the range before it (which ends at byte \
                 {previous_end}): ranges must be in file order and must not overlap"
            ),
            PlanError::SlotTooSmall { slot_bytes, align } => write!(
                f,
                "a slot of {slot_bytes} bytes cannot hold two blocks of {align}: choose a larger slot"
            ),
        }
    }
}

fn align_down(x: u64, align: u64) -> u64 {
    x - x % align
}

/// The requests that read `pieces` (in file order, not overlapping, each within `file_len`; an empty piece may
/// be anywhere) into slots of
/// `slot_bytes`, aligned to `align` (1 for buffered reads, [`DIRECT_ALIGN`] for direct ones; `slot_bytes` a
/// multiple of it). Pieces of no bytes make no upload. Ranges closer than [`MERGE_GAP`] share a request.
pub(crate) fn plan(
    pieces: &[Piece],
    file_len: u64,
    slot_bytes: usize,
    align: u64,
) -> Result<Vec<Request>, PlanError> {
    assert!(align.is_power_of_two(), "the alignment is a power of two");
    if (slot_bytes as u64) < 2 * align || !(slot_bytes as u64).is_multiple_of(align) {
        return Err(PlanError::SlotTooSmall { slot_bytes, align });
    }
    let slot = slot_bytes as u64;
    check_pieces(pieces, file_len)?;
    let mut requests = Vec::new();
    // The request being built: its offset, and the end of the bytes it must deliver.
    let mut open: Option<(Request, u64)> = None;
    for piece in pieces.iter().filter(|piece| piece.len > 0) {
        let end = piece.file + piece.len;
        let mut pos = piece.file;
        while pos < end {
            let fits = open.as_ref().is_some_and(|(request, data_end)| {
                pos < request.offset + slot && pos <= data_end + MERGE_GAP
            });
            if !fits {
                if let Some(done) = open.take() {
                    requests.push(finish(done, align));
                }
                let offset = align_down(pos, align);
                let request = Request {
                    offset,
                    len: 0,
                    needed: 0,
                    uploads: Vec::new(),
                };
                open = Some((request, pos));
            }
            let (request, data_end) = open.as_mut().expect("a request is open");
            let take = end.min(request.offset + slot) - pos;
            request.uploads.push(Upload {
                slot_at: (pos - request.offset) as usize,
                dest: piece.dest,
                at: piece.at + (pos - piece.file),
                len: take as usize,
            });
            pos += take;
            *data_end = pos;
        }
    }
    if let Some(done) = open {
        requests.push(finish(done, align));
    }
    Ok(requests)
}

/// Checks that `pieces` are in file order, do not overlap (an empty piece may be anywhere) and end within
/// `file_len`; else the first piece that is not.
pub(crate) fn check_pieces(pieces: &[Piece], file_len: u64) -> Result<(), PlanError> {
    let mut previous_end = 0;
    for (index, piece) in pieces.iter().enumerate() {
        let start = piece.file;
        let end = start.checked_add(piece.len).filter(|&end| end <= file_len);
        let Some(end) = end else {
            return Err(PlanError::PastEnd {
                index,
                start,
                end: start.saturating_add(piece.len),
                file_len,
            });
        };
        if piece.len > 0 && start < previous_end {
            return Err(PlanError::Overlaps {
                index,
                start,
                previous_end,
            });
        }
        if piece.len > 0 {
            previous_end = end;
        }
    }
    Ok(())
}

/// A request's lengths, from the end of the bytes it must deliver.
fn finish((mut request, data_end): (Request, u64), align: u64) -> Request {
    let needed = data_end - request.offset;
    request.needed = needed as usize;
    request.len = needed.next_multiple_of(align) as usize;
    request
}

/// Checks what every plan must be: requests aligned, within a slot, and every byte of every piece uploaded
/// once, from where the request read it, and nothing else. Shared by the unit tests and the fuzz target
/// (`cuda_pinned::fuzzing::load::plan`).
///
/// # Panics
/// Where `requests` break one of those.
#[cfg(any(test, fuzzing))]
pub(crate) fn check(pieces: &[Piece], requests: &[Request], slot_bytes: usize, align: u64) {
    let mut delivered: Vec<(u64, u64, usize, u64)> = Vec::new();
    for request in requests {
        assert_eq!(request.offset % align, 0, "{request:?}");
        assert_eq!(request.len as u64 % align, 0, "{request:?}");
        assert!(
            request.len <= slot_bytes && request.needed <= request.len,
            "{request:?}"
        );
        assert!(
            request.needed > 0 && !request.uploads.is_empty(),
            "{request:?}"
        );
        for upload in &request.uploads {
            assert!(upload.len > 0 && upload.slot_at + upload.len <= request.needed);
            let file = request.offset + upload.slot_at as u64;
            delivered.push((file, upload.len as u64, upload.dest, upload.at));
        }
    }
    // Every piece's bytes, in order, and nothing else.
    let mut at = 0;
    for piece in pieces.iter().filter(|p| p.len > 0) {
        let mut pos = piece.file;
        while pos < piece.file + piece.len {
            let (file, len, dest, to) = delivered[at];
            assert_eq!(
                (file, dest, to),
                (pos, piece.dest, piece.at + pos - piece.file)
            );
            pos += len;
            at += 1;
        }
        assert_eq!(pos, piece.file + piece.len, "no upload runs past its piece");
    }
    assert_eq!(at, delivered.len(), "no upload of bytes no piece wants");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(file: u64, len: u64, at: u64) -> Piece {
        Piece {
            file,
            len,
            dest: 0,
            at,
        }
    }

    #[test]
    fn one_range_is_cut_into_aligned_slots() {
        let pieces = [piece(100, 20_000, 0)];
        let requests = plan(&pieces, 30_000, 8192, 4096).unwrap();
        check(&pieces, &requests, 8192, 4096);
        let offsets: Vec<u64> = requests.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [0, 8192, 16384]);
        assert_eq!(requests[0].uploads[0].slot_at, 100);
        assert_eq!(requests[2].needed, 20_100 - 16384);
        assert_eq!(requests[2].len, 4096, "rounded up to a block");
    }

    #[test]
    fn buffered_reads_start_where_the_bytes_do() {
        let pieces = [piece(100, 20_000, 0)];
        let requests = plan(&pieces, 30_000, 8192, 1).unwrap();
        check(&pieces, &requests, 8192, 1);
        assert_eq!(requests[0].offset, 100);
        assert_eq!(requests.last().unwrap().len, 20_100 - 2 * 8192 - 100);
    }

    #[test]
    fn near_ranges_share_a_request_and_far_ones_do_not() {
        let pieces = [
            piece(0, 1000, 0),
            piece(1000 + MERGE_GAP, 1000, 1000),
            piece(3000 + 3 * MERGE_GAP, 1000, 2000),
        ];
        let requests = plan(&pieces, 1 << 20, 1 << 20, 4096).unwrap();
        check(&pieces, &requests, 1 << 20, 4096);
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].uploads.len(), 2);
    }

    #[test]
    fn bad_pieces_are_refused_with_their_offsets() {
        let past = plan(&[piece(10, 100, 0)], 50, 8192, 1).unwrap_err();
        assert_eq!(past.offset(), 10);
        assert!(
            past.to_string()
                .contains("ends past the end of the file (50 bytes)"),
            "{past}"
        );
        let wrapping = plan(&[piece(u64::MAX - 1, 10, 0)], u64::MAX, 8192, 1).unwrap_err();
        assert!(
            matches!(wrapping, PlanError::PastEnd { .. }),
            "{wrapping:?}"
        );
        let overlap = plan(&[piece(0, 100, 0), piece(50, 10, 100)], 1000, 8192, 1).unwrap_err();
        assert_eq!(overlap.offset(), 50);
        // Control: the same pieces in order and apart are planned.
        plan(&[piece(0, 50, 0), piece(50, 10, 100)], 1000, 8192, 1).unwrap();
        let small = plan(&[piece(0, 10, 0)], 1000, 4096, 4096).unwrap_err();
        assert!(matches!(small, PlanError::SlotTooSmall { .. }), "{small:?}");
    }

    #[test]
    fn empty_pieces_make_no_uploads() {
        let pieces = [piece(0, 0, 0), piece(0, 10, 0), piece(10, 0, 10)];
        let requests = plan(&pieces, 10, 8192, 4096).unwrap();
        check(&pieces, &requests, 8192, 4096);
        assert_eq!(requests.len(), 1);
        assert!(plan(&[], 0, 8192, 4096).unwrap().is_empty());
    }

    proptest::proptest! {
        #[test]
        fn every_byte_is_uploaded_once(
            gaps in proptest::collection::vec((0u64..200_000, 0u64..300_000), 0..12),
            slot_blocks in 2usize..40,
            direct: bool,
        ) {
            let align = if direct { DIRECT_ALIGN } else { 1 };
            let slot_bytes = slot_blocks * DIRECT_ALIGN as usize;
            let (mut pos, mut at, mut pieces) = (0, 0, Vec::new());
            for (i, (gap, len)) in gaps.into_iter().enumerate() {
                pos += gap;
                pieces.push(Piece { file: pos, len, dest: i % 3, at });
                pos += len;
                at += len + 7;
            }
            let requests = plan(&pieces, pos + 10, slot_bytes, align).unwrap();
            check(&pieces, &requests, slot_bytes, align);
        }
    }
}
