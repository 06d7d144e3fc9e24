//! Faults on demand: driver calls that fail with a chosen code.
//!
//! A fault list is comma-separated entries `FUNCTION:N:CODE`:
//! - `FUNCTION` is a driver function's exported name (`cuMemAlloc_v2`), or `*` for any driver call but
//!   `cuGetErrorName` and `cuGetErrorString` (which describe errors, so failing them only hides the first);
//! - `N` counts the calls that match, from when the fault was set: `3` fails the third, `3+` the third and
//!   every later one;
//! - `CODE` is a `CUresult` name (`CUDA_ERROR_OUT_OF_MEMORY`) or number (`2`).
//!
//! `CUDA_SIM_FAIL` sets the list when the simulator starts; `cuda_sim_fail` adds entries at run time.

use crate::codes;
use crate::sys::CUresult;

#[derive(Debug)]
struct Fault {
    function: Option<String>,
    nth: u64,
    and_later: bool,
    code: CUresult,
    seen: u64,
}

/// The faults set, and a count and a trace of the calls that could fail.
#[derive(Default)]
pub(crate) struct Faults {
    faults: Vec<Fault>,
    /// Driver calls so far that `*` counts.
    pub(crate) calls: u64,
    /// The names of such calls, in order, from when tracing last started.
    pub(crate) trace: Vec<&'static str>,
    pub(crate) tracing: bool,
    /// The functions whose calls were made to fail, in order.
    pub(crate) injected: Vec<&'static str>,
}

impl Faults {
    /// Adds the entries of `spec`, or says what is wrong with it (and adds none).
    pub(crate) fn add(&mut self, spec: &str) -> Result<(), String> {
        let mut parsed = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parts: Vec<&str> = entry.split(':').collect();
            let [function, nth, code] = parts[..] else {
                return Err(format!("fault {entry:?} is not FUNCTION:N:CODE"));
            };
            let (nth, and_later) = match nth.strip_suffix('+') {
                Some(n) => (n, true),
                None => (nth, false),
            };
            let nth: u64 = nth
                .parse()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("fault {entry:?}: N must be a number from 1"))?;
            let code = codes::parse(code)
                .ok_or_else(|| format!("fault {entry:?}: unknown code {code:?}"))?;
            let function = (function != "*").then(|| function.to_owned());
            parsed.push(Fault {
                function,
                nth,
                and_later,
                code,
                seen: 0,
            });
        }
        self.faults.extend(parsed);
        Ok(())
    }

    pub(crate) fn clear(&mut self) {
        self.faults.clear();
    }

    /// Counts a call of `function`; the code to fail it with, if a fault says so.
    pub(crate) fn on_call(&mut self, function: &'static str) -> Option<CUresult> {
        let describes_errors = matches!(function, "cuGetErrorName" | "cuGetErrorString");
        if !describes_errors {
            self.calls += 1;
            if self.tracing {
                self.trace.push(function);
            }
        }
        let mut fail = None;
        for fault in &mut self.faults {
            let matches = match &fault.function {
                Some(name) => name == function,
                None => !describes_errors,
            };
            if matches {
                fault.seen += 1;
                if fault.seen == fault.nth || (fault.and_later && fault.seen > fault.nth) {
                    fail = fail.or(Some(fault.code));
                }
            }
        }
        self.faults.retain(|f| f.and_later || f.seen < f.nth);
        if fail.is_some() {
            self.injected.push(function);
        }
        fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_call_of_a_function_fails() {
        let mut faults = Faults::default();
        faults
            .add("cuMemAlloc_v2:2:CUDA_ERROR_OUT_OF_MEMORY")
            .unwrap();
        assert_eq!(faults.on_call("cuMemAlloc_v2"), None);
        assert_eq!(faults.on_call("cuMemFree_v2"), None);
        assert_eq!(
            faults.on_call("cuMemAlloc_v2"),
            Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(faults.on_call("cuMemAlloc_v2"), None);
        assert_eq!(faults.calls, 4);
    }

    #[test]
    fn any_call_and_later_ones() {
        let mut faults = Faults::default();
        faults.add("*:2+:2").unwrap();
        assert_eq!(faults.on_call("cuInit"), None);
        assert_eq!(faults.on_call("cuGetErrorName"), None);
        assert_eq!(
            faults.on_call("cuDeviceGet"),
            Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(
            faults.on_call("cuDeviceGet"),
            Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        faults.clear();
        assert_eq!(faults.on_call("cuDeviceGet"), None);
    }

    #[test]
    fn bad_specs_say_why() {
        let mut faults = Faults::default();
        assert!(faults.add("cuInit:0:2").unwrap_err().contains("from 1"));
        assert!(
            faults
                .add("cuInit:1")
                .unwrap_err()
                .contains("FUNCTION:N:CODE")
        );
        assert!(
            faults
                .add("cuInit:1:CUDA_ERROR_NOPE")
                .unwrap_err()
                .contains("unknown code")
        );
        assert!(faults.faults.is_empty());
    }
}
