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
