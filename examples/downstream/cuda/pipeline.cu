// The downstream crate's own kernels, compiled by its build.rs (feature `gpu`) into a fatbin that the crate
// loads with cuda_pinned::Module::load. Integer arithmetic wraps (mod 2^32), so results are exact on any
// order of summation and the tests compare them with the host's bit for bit.

// y[i] = a * x[i] + b for i < n.
extern "C" __global__ void scale_shift(const unsigned* x, unsigned* y, unsigned a, unsigned b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + b;
    }
}

// sums[k] = y[256k] + ... + y[256k + 255] (those below n), for the blocks of 256 threads of the launch.
extern "C" __global__ void block_sums(const unsigned* y, unsigned* sums, unsigned n) {
    __shared__ unsigned partial[256];
    unsigned i = blockIdx.x * 256 + threadIdx.x;
    partial[threadIdx.x] = i < n ? y[i] : 0;
    __syncthreads();
    for (unsigned half = 128; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            partial[threadIdx.x] += partial[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        sums[blockIdx.x] = partial[0];
    }
}

// Keeps its stream busy for about `ns` nanoseconds of the GPU's global timer, touching no memory: for the
// tests' controls, so that work left out of the tracking shows as wrong data.
extern "C" __global__ void delay(unsigned long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start >= ns) {
            break;
        }
    }
}
