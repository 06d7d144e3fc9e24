//! What the fuzz targets share: reading an input front to back, so that every input is valid and its layout
//! can be written down (each target describes its own at the top of its file).

/// Reads a fuzz input front to back; past its end every read is zero or empty.
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader(data)
    }

    /// Whether everything has been read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The next byte.
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// The next `N` bytes.
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.byte())
    }

    /// The next 4 bytes, little-endian.
    pub fn u32_le(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    /// The next 8 bytes, little-endian.
    pub fn u64_le(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    /// A length byte, then that many bytes (fewer where the input ends first).
    pub fn field(&mut self) -> &'a [u8] {
        let len = usize::from(self.byte()).min(self.0.len());
        let (field, rest) = self.0.split_at(len);
        self.0 = rest;
        field
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}
