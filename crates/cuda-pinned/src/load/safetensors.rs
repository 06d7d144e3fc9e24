//! safetensors checkpoints: the header parsed by the `safetensors` crate and checked against the file, then all
//! or some of its tensors loaded into one device buffer in one overlapped read.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use safetensors::Dtype;

use super::engine::Dest;
use super::file::Opened;
use super::plan::Piece;
use super::{Io, LoadOptions, LoadReport, load_opened};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceView, PinnedPool};

/// The bytes before the header: its length, little-endian.
const LENGTH_BYTES: u64 = 8;

/// The longest header the format allows (the `safetensors` crate refuses longer ones).
const MAX_HEADER: u64 = 100_000_000;

/// Where each tensor of a subset starts in its device buffer: a multiple of this, as a device allocation's
/// base is, so that a kernel may read any tensor with aligned loads.
const TENSOR_ALIGN: u64 = 256;

/// One tensor of a safetensors file, as its header describes it (checked against the file's length).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    file: Range<u64>,
}

impl TensorInfo {
    /// Its name in the header.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Its shape (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Where its bytes are in the file.
    pub fn file_range(&self) -> Range<u64> {
        self.file.clone()
    }

    /// Its length in bytes.
    pub fn byte_len(&self) -> u64 {
        self.file.end - self.file.start
    }
}

/// A safetensors file whose header has been read and checked: every tensor's dtype, shape and byte range are
/// consistent and within the file.
#[derive(Clone, Debug)]
pub struct SafeTensorsFile {
    path: PathBuf,
    len: u64,
    /// Tensors in file order.
    tensors: Vec<TensorInfo>,
    metadata: Option<HashMap<String, String>>,
}

impl SafeTensorsFile {
    /// Opens `path` and reads its header. Returns once the header has been read and checked; reads no tensor.
    ///
    /// # Errors
    /// [`Error::File`] naming the file and the byte: it cannot be opened or read, is shorter than its header's
    /// length says, has a header that is not the format's JSON (an unknown dtype, a shape that does not match
    /// its byte range, tensors that overlap or leave gaps), or is shorter or longer than its tensors say.
    pub fn open(path: impl AsRef<Path>) -> Result<SafeTensorsFile> {
        let path = path.as_ref();
        let opened = Opened::open(path, false)?;
        let mut length = [0u8; LENGTH_BYTES as usize];
        let read = (&opened.buffered).read_exact(&mut length);
        read.map_err(|e| {
            Error::file(
                path,
                0,
                format_args!("cannot read the header's length: {e}"),
            )
        })?;
        let n = header_length(u64::from_le_bytes(length), opened.len)
            .map_err(|(offset, e)| Error::file(path, offset, e))?;
        let mut header = vec![0u8; n as usize];
        (&opened.buffered).read_exact(&mut header).map_err(|e| {
            Error::file(
                path,
                LENGTH_BYTES,
                format_args!("cannot read the header: {e}"),
            )
        })?;
        let (tensors, metadata) = parse_header(&header, opened.len)
            .map_err(|(offset, e)| Error::file(path, offset, e))?;
        Ok(SafeTensorsFile {
            path: path.to_path_buf(),
            len: opened.len,
            tensors,
            metadata,
        })
    }

    /// The file, as it was named to [`SafeTensorsFile::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if the file has one.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The header's `__metadata__` (free-form strings, such as `{"format": "pt"}`), if it has one.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Loads every tensor into one device buffer laid out as the file's data (each tensor where its header
    /// puts it), with the default [`LoadOptions`]: one overlapped read of the file (see [`crate::load`]).
    /// Returns once every byte has been read, the uploads running on `stream` (tracked).
    ///
    /// # Errors
    /// As [`crate::Stream::load_file`], and [`Error::File`] if the file has changed length since it was opened.
    pub fn load(&self, stream: &Stream, pool: &PinnedPool) -> Result<Tensors> {
        self.load_with(stream, pool, LoadOptions::default(), None)
    }

    /// Loads the tensors called `names` (in file order, each at a multiple of 256 bytes of one device buffer),
    /// as [`SafeTensorsFile::load`] loads them all.
    ///
    /// # Errors
    /// As [`SafeTensorsFile::load`], and an invalid-argument error naming a tensor the file lacks (nothing is
    /// read then).
    pub fn load_only(&self, stream: &Stream, pool: &PinnedPool, names: &[&str]) -> Result<Tensors> {
        self.load_with(stream, pool, LoadOptions::default(), Some(names))
    }

    /// [`SafeTensorsFile::load`] (`names` `None`) or [`SafeTensorsFile::load_only`] with other options.
    ///
    /// # Errors
    /// As those two.
    pub fn load_with(
        &self,
        stream: &Stream,
        pool: &PinnedPool,
        options: LoadOptions,
        names: Option<&[&str]>,
    ) -> Result<Tensors> {
        let started = Instant::now();
        let chosen: Vec<&TensorInfo> = match names {
            None => self.tensors.iter().collect(),
            Some(names) => {
                for name in names {
                    if self.tensor(name).is_none() {
                        return Err(Error::invalid(format_args!(
                            "{}: no tensor called {name:?}",
                            self.path.display()
                        )));
                    }
                }
                self.tensors
                    .iter()
                    .filter(|t| names.contains(&t.name.as_str()))
                    .collect()
            }
        };
        // Where each tensor goes: as in the file for all of them, else packed and aligned.
        let data_start = self.tensors.first().map_or(self.len, |t| t.file.start);
        let mut placed = Vec::with_capacity(chosen.len());
        let mut end = 0u64;
        for tensor in &chosen {
            let at = if names.is_none() {
                tensor.file.start - data_start
            } else {
                end.next_multiple_of(TENSOR_ALIGN)
            };
            end = at + tensor.byte_len();
            placed.push(at);
        }
        let opened = Opened::open(&self.path, options.io != Io::Buffered)?;
        if opened.len != self.len {
            return Err(Error::file(
                &self.path,
                opened.len.min(self.len),
                format_args!(
                    "the file is {} bytes long now, {} when its header was read: it changed",
                    opened.len, self.len
                ),
            ));
        }
        let buffer = DeviceBuffer::<u8>::uninit(stream, end as usize)?;
        let pieces: Vec<Piece> = chosen
            .iter()
            .zip(&placed)
            .map(|(tensor, &at)| Piece {
                file: tensor.file.start,
                len: tensor.byte_len(),
                dest: 0,
                at,
            })
            .collect();
        let dests = [Dest {
            ptr: buffer.as_raw(),
            bytes: end,
            track: buffer.track(),
        }];
        let report = load_opened(
            stream,
            pool,
            options,
            &opened,
            &opened.buffered,
            &pieces,
            &dests,
            started,
        )?;
        let index = chosen
            .into_iter()
            .zip(placed)
            .map(|(tensor, at)| {
                (
                    tensor.clone(),
                    at as usize..(at + tensor.byte_len()) as usize,
                )
            })
            .collect();
        Ok(Tensors::new(buffer, index, report))
    }
}

/// The header's length `n` checked against the file's `len`; else the offset and what is wrong.
pub(crate) fn header_length(n: u64, len: u64) -> std::result::Result<u64, (u64, String)> {
    if len < LENGTH_BYTES {
        return Err((
            0,
            format!("{len} bytes: shorter than the 8 bytes of a safetensors header's length"),
        ));
    }
    if n > MAX_HEADER {
        return Err((
            0,
            format!("the header's length, {n} bytes, is over the format's {MAX_HEADER}"),
        ));
    }
    if LENGTH_BYTES + n > len {
        return Err((
            LENGTH_BYTES,
            format!("the header's length, {n} bytes, runs past the end of the file ({len} bytes)"),
        ));
    }
    Ok(n)
}

/// A header's tensors (in file order) and metadata.
pub(crate) type Parsed = (Vec<TensorInfo>, Option<HashMap<String, String>>);

/// The tensors (in file order) and metadata of `header` (the JSON after the length) in a file of `len` bytes;
/// else the offset in the file and what is wrong. The `safetensors` crate parses the JSON and checks that the
/// tensors' shapes match their byte ranges, which follow each other from 0; this checks them against the file.
pub(crate) fn parse_header(header: &[u8], len: u64) -> std::result::Result<Parsed, (u64, String)> {
    let data_start = LENGTH_BYTES + header.len() as u64;
    let metadata: safetensors::tensor::Metadata = serde_json::from_slice(header).map_err(|e| {
        let message = e.to_string();
        let at =
            named_in(header, &message).unwrap_or_else(|| json_offset(header, e.line(), e.column()));
        (
            LENGTH_BYTES + at,
            format!("the header is not a valid safetensors header: {message}"),
        )
    })?;
    // The data's end, checked against the file before any offset is added to the header's end: the format's
    // offsets go up to 2^64, and a sum past it must be an error, not a wrapped offset.
    let data_len = metadata.data_len() as u64;
    let room = len.saturating_sub(data_start);
    if data_len > room {
        let first = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (info.data_offsets.1 as u64, name))
            .filter(|&(end, _)| end > room)
            .min()
            .map_or(String::new(), |(_, name)| name);
        return Err((
            len,
            format!(
                "the file ends here, before the end of its tensors' data ({data_len} bytes from byte \
                 {data_start}; tensor {first:?} is cut): it is truncated, or its header lies"
            ),
        ));
    }
    let data_end = data_start + data_len;
    if data_end < len {
        return Err((
            data_end,
            format!(
                "{} bytes follow the last tensor's data, which the header does not describe",
                len - data_end
            ),
        ));
    }
    // Every offset is at most `data_len`, so no sum below passes `len`.
    let mut tensors: Vec<TensorInfo> = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| TensorInfo {
            name,
            dtype: info.dtype,
            shape: info.shape.clone(),
            file: data_start + info.data_offsets.0 as u64..data_start + info.data_offsets.1 as u64,
        })
        .collect();
    // By start, then end: an empty tensor may start where another does.
    tensors.sort_by_key(|t| (t.file.start, t.file.end));
    Ok((tensors, metadata.metadata().clone()))
}

/// Where in `header` the value an error names is: the dtype of "unknown variant `X`" or the tensor of
/// "... for tensor `X`" (the format's checks run after parsing, where serde_json's position is the header's
/// end), as the first `"X"` in it.
fn named_in(header: &[u8], message: &str) -> Option<u64> {
    let named = ["unknown variant `", "for tensor `"]
        .iter()
        .find_map(|lead| message.split_once(lead))?
        .1
        .split('`')
        .next()?;
    let quoted = format!("\"{named}\"");
    let at = header
        .windows(quoted.len())
        .position(|w| w == quoted.as_bytes())?;
    Some(at as u64)
}

/// The byte of `text` at serde_json's `line` and `column` (both from 1; 0 for none).
pub(crate) fn json_offset(text: &[u8], line: usize, column: usize) -> u64 {
    let line_start: usize = text
        .split(|&b| b == b'\n')
        .take(line.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    (line_start + column.saturating_sub(1)).min(text.len()) as u64
}

/// Tensors loaded into one device buffer: each a view of it.
pub struct Tensors {
    buffer: DeviceBuffer<u8>,
    /// In file order: each tensor and where it is in the buffer.
    index: Vec<(TensorInfo, Range<usize>)>,
    by_name: HashMap<String, usize>,
    report: LoadReport,
}

impl Tensors {
    fn new(
        buffer: DeviceBuffer<u8>,
        index: Vec<(TensorInfo, Range<usize>)>,
        report: LoadReport,
    ) -> Tensors {
        let by_name = index
            .iter()
            .enumerate()
            .map(|(i, (tensor, _))| (tensor.name.clone(), i))
            .collect();
        Tensors {
            buffer,
            index,
            by_name,
            report,
        }
    }

    /// The bytes of the tensor called `name`, if it was loaded: a view of the buffer, which work on any stream
    /// may read (it waits on the device for the load's uploads).
    pub fn get(&self, name: &str) -> Option<DeviceView<'_, u8>> {
        let range = self.range(name)?;
        self.buffer.slice(range).ok()
    }

    /// What the header says of the tensor called `name`, if it was loaded.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.index[i].0)
    }

    /// Where the tensor called `name` is in [`Tensors::buffer`], if it was loaded.
    pub fn range(&self, name: &str) -> Option<Range<usize>> {
        self.by_name.get(name).map(|&i| self.index[i].1.clone())
    }

    /// The loaded tensors, in file order, with where each is in the buffer.
    pub fn iter(&self) -> impl Iterator<Item = (&TensorInfo, Range<usize>)> {
        self.index
            .iter()
            .map(|(tensor, range)| (tensor, range.clone()))
    }

    /// How many tensors were loaded.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The device buffer that holds them.
    pub fn buffer(&self) -> &DeviceBuffer<u8> {
        &self.buffer
    }

    /// The device buffer, to write to (a view of it per tensor: [`DeviceBuffer::slice_mut`] of
    /// [`Tensors::range`]).
    pub fn buffer_mut(&mut self) -> &mut DeviceBuffer<u8> {
        &mut self.buffer
    }

    /// The device buffer, and where each tensor is in it.
    pub fn into_parts(self) -> (DeviceBuffer<u8>, Vec<(TensorInfo, Range<usize>)>) {
        (self.buffer, self.index)
    }

    /// How the load read the file.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }
}

impl std::fmt::Debug for Tensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensors")
            .field("tensors", &self.index.len())
            .field("bytes", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of `json`: the tensors, or the error's offset and message.
    fn parse(json: &str, data: u64) -> std::result::Result<Parsed, (u64, String)> {
        parse_header(json.as_bytes(), LENGTH_BYTES + json.len() as u64 + data)
    }

    const TWO: &str = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,3],"data_offsets":[16,28]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;

    #[test]
    fn tensors_come_in_file_order_with_their_file_ranges() {
        let (tensors, metadata) = parse(TWO, 28).unwrap();
        let start = LENGTH_BYTES + TWO.len() as u64;
        assert_eq!(tensors[0].name(), "a");
        assert_eq!(tensors[0].file_range(), start..start + 16);
        assert_eq!(
            (tensors[1].dtype(), tensors[1].shape()),
            (Dtype::F16, &[2, 3][..])
        );
        assert_eq!(metadata.unwrap()["format"], "pt");
    }

    #[test]
    fn a_file_shorter_or_longer_than_its_tensors_is_refused() {
        let start = LENGTH_BYTES + TWO.len() as u64;
        let (offset, message) = parse(TWO, 20).unwrap_err();
        assert_eq!(offset, start + 20);
        assert!(message.contains("tensor \"b\" is cut"), "{message}");
        let (offset, message) = parse(TWO, 30).unwrap_err();
        assert_eq!(offset, start + 28);
        assert!(message.contains("2 bytes follow"), "{message}");
    }

    #[test]
    fn lying_headers_are_refused_where_they_lie() {
        for (json, says) in [
            (
                r#"{"a":{"dtype":"F12","shape":[4],"data_offsets":[0,16]}}"#,
                "unknown variant `F12`",
            ),
            // A shape of 5 floats in 16 bytes.
            (
                r#"{"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}}"#,
                "invalid shape, data type, or offset for tensor",
            ),
            // Two tensors over the same bytes.
            (
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
                "invalid offset for tensor `b`",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]"#,
                "EOF",
            ),
        ] {
            let (offset, message) = parse(json, 16).unwrap_err();
            assert!(message.contains(says), "{json}: {message}");
            assert!(
                offset >= LENGTH_BYTES && offset <= LENGTH_BYTES + json.len() as u64,
                "{offset}"
            );
            if let Some(at) = json.find("\"F12\"").or_else(|| json.find("\"b\"")) {
                assert_eq!(offset, LENGTH_BYTES + at as u64, "{json}: {message}");
            }
        }
    }

    #[test]
    fn offsets_near_the_top_of_u64_are_refused_not_wrapped() {
        // Eight tensors of 2^61 - 1 bytes end to end: their end is near 2^64, past any file.
        let big = (1u64 << 61) - 1;
        let entries: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    r#""t{i}":{{"dtype":"U8","shape":[{big}],"data_offsets":[{},{}]}}"#,
                    i * big,
                    (i + 1) * big
                )
            })
            .collect();
        let json = format!("{{{}}}", entries.join(","));
        let (offset, message) = parse(&json, 100).unwrap_err();
        assert_eq!(offset, LENGTH_BYTES + json.len() as u64 + 100);
        assert!(message.contains("tensor \"t0\" is cut"), "{message}");
    }

    #[test]
    fn header_lengths_that_lie_are_refused() {
        assert_eq!(header_length(100, 108), Ok(100));
        assert_eq!(header_length(101, 108).unwrap_err().0, LENGTH_BYTES);
        assert!(
            header_length(MAX_HEADER + 1, u64::MAX)
                .unwrap_err()
                .1
                .contains("over the format's")
        );
        assert!(
            header_length(0, 7)
                .unwrap_err()
                .1
                .contains("shorter than the 8 bytes")
        );
    }

    #[test]
    fn serde_positions_become_file_offsets() {
        assert_eq!(json_offset(b"{\"a\": x}", 1, 7), 6);
        assert_eq!(json_offset(b"{\n  \"a\": x}", 2, 8), 9);
    }
}
