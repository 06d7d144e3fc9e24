//! What the simulator's test binaries share: raw driver calls through the loaded driver's table.

/// The raw code of a driver call: `raw!(cuMemAlloc_v2(&mut p, 16))`. It stands in an `unsafe` block whose
/// `SAFETY` comment covers the arguments.
macro_rules! raw {
    ($function:ident($($arg:expr),* $(,)?)) => {{
        let driver = cuda_pinned_sys::driver().expect("the simulated driver loads");
        let f = driver
            .function(&driver.api().$function, stringify!($function))
            .expect("the simulated driver exports it");
        f($($arg),*)
    }};
}

/// Asserts that a driver call succeeded.
macro_rules! ok {
    ($function:ident($($arg:expr),* $(,)?)) => {
        assert_eq!(
            raw!($function($($arg),*)),
            cuda_pinned_sys::CUresult::CUDA_SUCCESS,
            stringify!($function)
        )
    };
}
