//! The simulator's settings, read once from the environment when it is first used.

use std::time::Duration;

/// Settings from the environment.
///
/// | variable                 | meaning                                                        | default |
/// |--------------------------|----------------------------------------------------------------|---------|
/// | `CUDA_SIM_SEED`          | seed of the random delays                                      | 1       |
/// | `CUDA_SIM_MAX_DELAY_US`  | the longest delay before a queued operation runs, microseconds | 200     |
/// | `CUDA_SIM_DEVICES`       | how many devices there are                                     | 1       |
/// | `CUDA_SIM_DEVICE_MEMORY` | bytes of memory per device (suffixes K, M, G, T)               | 16G     |
/// | `CUDA_SIM_PINNED_LIMIT`  | bytes of pinned host memory the process may allocate           | 8G      |
/// | `CUDA_SIM_FAIL`          | faults to inject: see `faults.rs`                              | none    |
pub(crate) struct Config {
    pub(crate) seed: u64,
    pub(crate) max_delay: Duration,
    pub(crate) devices: i32,
    pub(crate) device_memory: usize,
    pub(crate) pinned_limit: usize,
    pub(crate) fail: Option<String>,
}

impl Config {
    pub(crate) fn from_env() -> Config {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| match var(name) {
            None => default,
            Some(v) => parse_bytes(&v).unwrap_or_else(|| {
                eprintln!("cuda-pinned-sim: ignoring {name}={v:?}: not a number");
                default
            }),
        };
        Config {
            seed: number("CUDA_SIM_SEED", 1),
            max_delay: Duration::from_micros(number("CUDA_SIM_MAX_DELAY_US", 200)),
            devices: number("CUDA_SIM_DEVICES", 1).min(64) as i32,
            device_memory: number("CUDA_SIM_DEVICE_MEMORY", 16 << 30) as usize,
            pinned_limit: number("CUDA_SIM_PINNED_LIMIT", 8 << 30) as usize,
            fail: var("CUDA_SIM_FAIL"),
        }
    }
}

/// `123`, `64K`, `256M`, `16G`, `1T` (powers of 1024).
pub(crate) fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 10),
        b'M' | b'm' => (&text[..text.len() - 1], 20),
        b'G' | b'g' => (&text[..text.len() - 1], 30),
        b'T' | b't' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("16G"), Some(16 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999T"), None);
    }
}
