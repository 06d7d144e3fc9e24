//! The pure parts of a file load (`src/load/`), chosen by the first byte: how byte ranges of a file are cut
//! into read requests and uploads (`plan.rs`), or the check of a safetensors file's header (`safetensors.rs`).
//!
//! **Plans.** Pieces of a file (offsets, lengths and destinations, in file order, some empty, some overlapping
//! the piece before or running past the end of the file, at offsets up to `u64::MAX`), planned into slots of a
//! size and alignment the input picks. Where the slot is not a multiple of the alignment or holds fewer than two
//! of its blocks, where a piece ends past the file's end (or its end overflows `u64`), or where a non-empty piece
//! starts before the end of the last non-empty one, the plan must refuse with exactly that error, of the first
//! such piece, naming its offset and index; otherwise `cuda_pinned::fuzzing::load::plan` checks the requests
//! (with the check the plan's unit tests share): aligned and within a slot, in file order, needing no byte past
//! the file's end, and every byte of every piece uploaded exactly once, in order, from where its request read it
//! to where the piece says, with no other upload, nor more than `MERGE_GAP` bytes read between two uploads.
//!
//! **safetensors.** The bytes of a whole file (its header's 8-byte length, the JSON header, the data), read as
//! `SafeTensorsFile::open` reads them (`cuda_pinned::fuzzing::load::read_header`). Nothing may panic. An error's
//! offset must be within the file. On success, every tensor's range must be within the file, the tensors in file
//! order, each starting where the one before ends (the first right after the header, the last ending at the
//! file's end), each of `product(shape) * bits / 8` bytes of its dtype, with distinct names; and the
//! `safetensors` crate's own reading of the file must succeed too, with the same tensors and metadata, and
//! fail wherever this fails.
//!
//! Input layout (a short input reads as zeros):
//!
//! | bytes | meaning                                                                                          |
//! |-------|--------------------------------------------------------------------------------------------------|
//! | 0     | the mode: bit 0 clear, a plan (the layout below); set, a safetensors file: the rest of the input |
//! |       | is the file if bit 1 is clear; if it is set, the rest is the header up to the first NUL and the  |
//! |       | data after it, and the file is the header's length (8 bytes, little-endian), header and data     |
//!
//! A plan (bytes 1 to 3, then numbers and pieces):
//!
//! | bytes   | meaning                                                                                        |
//! |---------|------------------------------------------------------------------------------------------------|
//! | 1       | bits 0-3 `a`: the alignment is `2^(a % 13)` (1 for buffered reads to 4096 for direct ones);    |
//! |         | bits 4-7 `u`                                                                                   |
//! | 2       | `k`: the slot holds `(k & 127) * 2^u` aligned blocks, plus one byte if bit 7 is set            |
//! | 3       | bit 0: the file is shorter than the pieces' end (else longer) by ...                           |
//! | number  | ... this many bytes; the file's length is at most `i64::MAX`, as a Linux file's is             |
//! | then    | up to 48 pieces to the end of the input, each a flags byte `f` and numbers:                    |
//! |         | bits 0-1 where it starts: 0 a number of bytes after the end of the piece before it, 1 a number |
//! |         | of bytes before that end (saturating at 0), 2 at a number, 3 where the piece before it starts  |
//! |         | (no number); bit 2 set: empty (no length), else its length, a number; bits 3-4 its destination |
//! |         | (0 to 3), where it goes right after the bytes of the pieces before it with that destination    |
//!
//! A number is a tag byte `t` (form `t % 8`, `k = t >> 3`, 0 to 31) and the bytes its form reads:
//!
//! | form | value                                                  | more bytes   |
//! |------|--------------------------------------------------------|--------------|
//! | 0    | `k`                                                    | none         |
//! | 1    | the byte                                               | one          |
//! | 2    | the `u16`, little-endian                               | two          |
//! | 3    | the `u32`, little-endian                               | four         |
//! | 4    | the `u64`, little-endian                               | eight        |
//! | 5    | `k * 4096` (whole blocks of a direct read)             | none         |
//! | 6    | `MERGE_GAP + k - 16` (about the gap that splits reads) | none         |
//! | 7    | `2^(b % 64) + k - 16` (wrapping)                       | one, `b`     |
//!
//! A plan of huge pieces in small slots would make billions of requests: where the pieces fit in the file and
//! would make more than 4096 requests of the slot asked for, the slot is grown (to a multiple of the alignment)
//! so that they make about that many.

#![no_main]

use std::collections::HashSet;

use cuda_pinned::fuzzing::load::{MERGE_GAP, Piece, Refusal, plan, read_header};
use cuda_pinned_fuzz::Reader;
use libfuzzer_sys::fuzz_target;

/// The most pieces a plan reads.
const MAX_PIECES: usize = 48;

/// The most requests (about) a plan is let make.
const MAX_REQUESTS: u64 = 4096;

/// The longest file: Linux's `off_t` is signed.
const MAX_FILE: u64 = i64::MAX as u64;

/// The bytes of a safetensors file's header length.
const LENGTH_BYTES: usize = 8;

/// A number in the encoding of the module docs.
fn number(input: &mut Reader<'_>) -> u64 {
    let t = input.byte();
    let k = u64::from(t >> 3);
    match t % 8 {
        0 => k,
        1 => u64::from(input.byte()),
        2 => u64::from(u16::from_le_bytes(input.bytes())),
        3 => u64::from(input.u32_le()),
        4 => input.u64_le(),
        5 => k * 4096,
        6 => MERGE_GAP + k - 16,
        _ => (1u64 << (input.byte() % 64))
            .wrapping_add(k)
            .wrapping_sub(16),
    }
}

/// What the plan must refuse, if anything: the slot first, then the first piece past the end or overlapping.
fn expected_refusal(
    pieces: &[Piece],
    file_len: u64,
    slot_bytes: usize,
    align: u64,
) -> Option<Refusal> {
    let slot = slot_bytes as u64;
    if slot < 2 * align || !slot.is_multiple_of(align) {
        return Some(Refusal::SlotTooSmall { slot_bytes, align });
    }
    let mut previous_end = 0;
    for (index, piece) in pieces.iter().enumerate() {
        let end = piece.file.checked_add(piece.len);
        if end.is_none_or(|end| end > file_len) {
            return Some(Refusal::PastEnd {
                index,
                start: piece.file,
                end: piece.file.saturating_add(piece.len),
                file_len,
            });
        }
        if piece.len > 0 {
            if piece.file < previous_end {
                return Some(Refusal::Overlaps {
                    index,
                    start: piece.file,
                    previous_end,
                });
            }
            previous_end = piece.file + piece.len;
        }
    }
    None
}

/// A plan from the input (after the mode byte), checked.
fn plan_case(input: &mut Reader<'_>) {
    let a = input.byte();
    let align = 1u64 << ((a & 15) % 13);
    let unit = align << (a >> 4);
    let k = input.byte();
    let mut slot_bytes = (u64::from(k & 127) * unit + u64::from(k >> 7)) as usize;
    let shorter = input.byte() & 1 == 1;
    let tail = number(input);

    let mut pieces: Vec<Piece> = Vec::new();
    let mut sent = [0u64; 4];
    while !input.is_empty() && pieces.len() < MAX_PIECES {
        let f = input.byte();
        let (previous_start, previous_end) = pieces
            .last()
            .map_or((0, 0), |p| (p.file, p.file.saturating_add(p.len)));
        let file = match f & 3 {
            0 => previous_end.saturating_add(number(input)),
            1 => previous_end.saturating_sub(number(input)),
            2 => number(input),
            _ => previous_start,
        };
        let len = if f & 4 != 0 { 0 } else { number(input) };
        let dest = usize::from((f >> 3) & 3);
        let at = sent[dest];
        sent[dest] = at.saturating_add(len);
        pieces.push(Piece {
            file,
            len,
            dest,
            at,
        });
    }
    let end = pieces
        .iter()
        .map(|p| p.file.saturating_add(p.len))
        .max()
        .unwrap_or(0);
    let file_len = if shorter {
        end.saturating_sub(tail)
    } else {
        end.saturating_add(tail)
    }
    .min(MAX_FILE);

    let mut expected = expected_refusal(&pieces, file_len, slot_bytes, align);
    let wanted = pieces.iter().fold(0u64, |sum, p| sum.saturating_add(p.len));
    if expected.is_none() && wanted.div_ceil(slot_bytes as u64) > MAX_REQUESTS {
        // The pieces fit in the file, so `wanted` does not overflow; a larger multiple of the alignment is a
        // valid slot too.
        slot_bytes = wanted.div_ceil(MAX_REQUESTS).next_multiple_of(align) as usize;
        expected = expected_refusal(&pieces, file_len, slot_bytes, align);
        assert_eq!(expected, None);
    }

    match (plan(&pieces, file_len, slot_bytes, align), expected) {
        (Ok(planned), None) => {
            let nonempty = pieces.iter().filter(|p| p.len > 0).count();
            assert!(planned.read >= wanted, "{planned:?} of {wanted} bytes");
            assert!(
                planned.uploads >= nonempty,
                "{planned:?} of {nonempty} pieces"
            );
            assert!(
                planned.requests as u64 >= wanted.div_ceil(slot_bytes as u64),
                "{planned:?} of {wanted} bytes in slots of {slot_bytes}"
            );
        }
        (Err(refused), Some(expected)) => {
            assert_eq!(refused.refusal, expected, "{pieces:?} in {file_len} bytes");
            let message = &refused.message;
            match expected {
                Refusal::PastEnd {
                    index, file_len, ..
                } => {
                    assert_eq!(refused.offset, pieces[index].file);
                    assert!(
                        message.starts_with(&format!("range {index} (bytes "))
                            && message.contains(&format!(
                                "ends past the end of the file ({file_len} bytes)"
                            )),
                        "{message}"
                    );
                }
                Refusal::Overlaps {
                    index,
                    start,
                    previous_end,
                } => {
                    assert_eq!(refused.offset, pieces[index].file);
                    assert!(
                        message.starts_with(&format!("range {index} starts at byte {start}, "))
                            && message.contains(&format!("ends at byte {previous_end})")),
                        "{message}"
                    );
                }
                Refusal::SlotTooSmall { slot_bytes, align } => {
                    assert_eq!(refused.offset, 0);
                    assert!(
                        message.starts_with(&format!(
                            "a slot of {slot_bytes} bytes cannot hold two blocks of {align}"
                        )),
                        "{message}"
                    );
                }
            }
        }
        (got, expected) => panic!(
            "{pieces:?} in {file_len} bytes, slots of {slot_bytes} aligned to {align}: got {got:?}, \
             expected {expected:?}"
        ),
    }
}

/// A safetensors file's bytes, checked.
fn safetensors_case(file: &[u8]) {
    let len = file.len() as u64;
    let ours = read_header(file);
    // The crate's reading second. It adds the header's end to the data's length unchecked, which overflows for
    // offsets near 2^64: where ours found the data longer than the file, it is not asked (ours must refuse).
    if let Err((offset, message)) = &ours
        && message.contains("the file ends here, before the end of its tensors' data")
    {
        assert_eq!(*offset, len, "{message}");
        return;
    }
    let reference = safetensors::SafeTensors::read_metadata(file);
    match (&ours, &reference) {
        (Ok((tensors, metadata)), Ok((n, theirs_all))) => {
            let data_start = (LENGTH_BYTES + n) as u64;
            let mut end = data_start;
            let mut names = HashSet::new();
            for t in tensors {
                let range = t.file_range();
                assert_eq!(
                    range.start,
                    end,
                    "tensor {:?} does not start where the one before it ends",
                    t.name()
                );
                assert!(range.start <= range.end && range.end <= len, "{t:?}");
                assert_eq!(t.byte_len(), range.end - range.start, "{t:?}");
                let elements = t
                    .shape()
                    .iter()
                    .try_fold(1u128, |n, &d| n.checked_mul(d as u128))
                    .expect("a shape of more than 2^128 elements");
                let bits = elements
                    .checked_mul(t.dtype().bitsize() as u128)
                    .expect("more than 2^128 bits");
                assert!(
                    bits % 8 == 0 && bits / 8 == u128::from(t.byte_len()),
                    "{t:?}: {elements} elements of {} bits",
                    t.dtype().bitsize()
                );
                assert!(names.insert(t.name()), "two tensors called {:?}", t.name());
                end = range.end;

                let theirs = theirs_all
                    .info(t.name())
                    .unwrap_or_else(|| panic!("the safetensors crate has no {:?}", t.name()));
                assert_eq!(
                    (theirs.dtype, &theirs.shape[..]),
                    (t.dtype(), t.shape()),
                    "{t:?}"
                );
                let (s, e) = theirs.data_offsets;
                assert_eq!(
                    (data_start + s as u64, data_start + e as u64),
                    (range.start, range.end),
                    "{t:?}"
                );
            }
            assert_eq!(end, len, "the data does not end at the file's end");
            assert_eq!(tensors.len(), theirs_all.tensors().len());
            assert_eq!(metadata, theirs_all.metadata());
        }
        (Err((offset, message)), Err(_)) => {
            assert!(
                *offset <= len,
                "offset {offset} of a {len}-byte file: {message}"
            );
            assert!(!message.is_empty());
        }
        (ours, reference) => panic!(
            "ours and the safetensors crate disagree on a {len}-byte file: {ours:?}, {reference:?}"
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Reader::new(data);
    let mode = input.byte();
    if mode & 1 == 0 {
        plan_case(&mut input);
    } else if mode & 2 == 0 {
        safetensors_case(input.rest());
    } else {
        let rest = input.rest();
        let (header, data) = match rest.iter().position(|&b| b == 0) {
            Some(nul) => (&rest[..nul], &rest[nul + 1..]),
            None => (rest, &[][..]),
        };
        let mut file = Vec::with_capacity(LENGTH_BYTES + rest.len());
        file.extend_from_slice(&(header.len() as u64).to_le_bytes());
        file.extend_from_slice(header);
        file.extend_from_slice(data);
        safetensors_case(&file);
    }
});
