// Kernels that the crate's tests load as a user's module would be: compiled by build.rs (feature `gpu`) into
// a fatbin in OUT_DIR, loaded with Module::load and launched with Stream::launch. The simulated driver runs
// Rust stand-ins of the same names (tests/user_kernels.rs).

// y[i] = a * x[i] for i < n.
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i];
    }
}

// out[i] = value for i < n.
extern "C" __global__ void fill_u32(unsigned* out, unsigned value, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = value;
    }
}

// y[i] = x[i] + add (wrapping) for i < n: the random programs' kernel (tests/common/program.rs).
extern "C" __global__ void add_u32(const unsigned* x, unsigned* y, unsigned add, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[i] + add;
    }
}

// out[i] = the sum (wrapping) of a0[i] .. a16[i] for i < n: more buffers than a launch tracks on the stack.
extern "C" __global__ void sum17_u32(const unsigned* a0, const unsigned* a1, const unsigned* a2,
                                     const unsigned* a3, const unsigned* a4, const unsigned* a5,
                                     const unsigned* a6, const unsigned* a7, const unsigned* a8,
                                     const unsigned* a9, const unsigned* a10, const unsigned* a11,
                                     const unsigned* a12, const unsigned* a13, const unsigned* a14,
                                     const unsigned* a15, const unsigned* a16, unsigned* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a0[i] + a1[i] + a2[i] + a3[i] + a4[i] + a5[i] + a6[i] + a7[i] + a8[i] + a9[i] + a10[i] +
                 a11[i] + a12[i] + a13[i] + a14[i] + a15[i] + a16[i];
    }
}

// Traps: the context takes a sticky error (every later call in it fails with CUDA_ERROR_LAUNCH_FAILED), as a
// failed device-side assertion leaves it. For the tests of what fails with the context (tests/futures_fault.rs).
extern "C" __global__ void trap_now() {
    __trap();
}
