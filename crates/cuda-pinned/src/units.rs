//! Units in messages: sizes as people write them. A leaf of the crate (it depends on nothing of it), so that
//! every layer, the error type included, can use it.

/// `1.5 GiB`, `256.0 MiB`, `12 bytes`: sizes in messages.
pub(crate) struct Bytes(pub usize);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        if self.0 < 1024 {
            return write!(f, "{} bytes", self.0);
        }
        let mut unit = "";
        for u in UNITS {
            if value < 1024.0 {
                break;
            }
            value /= 1024.0;
            unit = u;
        }
        write!(f, "{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(Bytes(12).to_string(), "12 bytes");
        assert_eq!(Bytes(1024).to_string(), "1.0 KiB");
        assert_eq!(Bytes(256 << 20).to_string(), "256.0 MiB");
        assert_eq!(Bytes(4 << 30).to_string(), "4.0 GiB");
        assert_eq!(Bytes(3 << 39).to_string(), "1.5 TiB");
    }
}
