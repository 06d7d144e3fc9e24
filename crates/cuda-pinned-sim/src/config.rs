//! The simulator's settings, read once when it is first used: those a test chose in code
//! ([`crate::Settings`], through `cuda_sim_configure`), else the environment's, else the defaults.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The variables the simulator reads.
pub(crate) const VARIABLES: &[&str] = &[
    "CUDA_SIM_SEED",
    "CUDA_SIM_MAX_DELAY_US",
    "CUDA_SIM_DEVICES",
    "CUDA_SIM_DEVICE_MEMORY",
    "CUDA_SIM_PINNED_LIMIT",
    "CUDA_SIM_FAIL",
    "CUDA_SIM_PEER_ACCESS",
];

/// Settings chosen in code, by variable name; they take precedence over the environment.
static CHOSEN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
/// Set once the settings have been read: choosing more then has no effect, so it is refused.
static READ: AtomicBool = AtomicBool::new(false);

/// Chooses `value` for `name` (one of [`VARIABLES`]) before the settings are read.
pub(crate) fn choose(name: &str, value: &str) -> Result<(), String> {
    if !VARIABLES.contains(&name) {
        return Err(format!("{name} is not a setting of the simulator"));
    }
    let mut chosen = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
    if READ.load(Ordering::SeqCst) {
        return Err(format!(
            "{name} was chosen after the simulator started: choose settings before the first CUDA call"
        ));
    }
    chosen.retain(|(n, _)| n != name);
    chosen.push((name.to_string(), value.to_string()));
    Ok(())
}

/// The settings, each chosen in code or taken from the environment variable of its name.
///
/// | variable                 | meaning                                                        | default |
/// |--------------------------|----------------------------------------------------------------|---------|
/// | `CUDA_SIM_SEED`          | seed of the random delays                                      | 1       |
/// | `CUDA_SIM_MAX_DELAY_US`  | the longest delay before a queued operation runs, microseconds | 200     |
/// | `CUDA_SIM_DEVICES`       | how many devices there are                                     | 1       |
/// | `CUDA_SIM_DEVICE_MEMORY` | bytes of memory per device (suffixes K, M, G, T)               | 16G     |
/// | `CUDA_SIM_PINNED_LIMIT`  | bytes of host memory the process may pin (alloc or register)   | 8G      |
/// | `CUDA_SIM_FAIL`          | faults to inject: see `faults.rs`                              | none    |
/// | `CUDA_SIM_PEER_ACCESS`   | whether two devices can access each other's memory (1 or 0)    | 1       |
pub(crate) struct Config {
    pub(crate) seed: u64,
    pub(crate) max_delay: Duration,
    pub(crate) devices: i32,
    pub(crate) device_memory: usize,
    pub(crate) pinned_limit: usize,
    pub(crate) fail: Option<String>,
    pub(crate) peer_access: bool,
}

impl Config {
    pub(crate) fn read() -> Config {
        let chosen = {
            let chosen = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
            READ.store(true, Ordering::SeqCst);
            chosen.clone()
        };
        let var = |name: &str| {
            let value = match chosen.iter().find(|(n, _)| n == name) {
                Some((_, value)) => Some(value.clone()),
                None => std::env::var(name).ok(),
            };
            value.filter(|v| !v.trim().is_empty())
        };
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
            peer_access: number("CUDA_SIM_PEER_ACCESS", 1) != 0,
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
