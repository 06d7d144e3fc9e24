// The crate's gather kernels (src/gather.rs): rows of a table in page-locked host memory, which the device reads
// in place through its mapping, copied into device memory by index. Output row k is table row indices[k], or,
// where `positions` is not null (indices sorted for locality, the batch's order kept), output row positions[k]
// is table row indices[k].
//
// Compiled to PTX by scripts/gather-ptx.sh (the crate embeds src/gather.ptx and loads it with Module::load, so
// no nvcc is needed to build the crate). One kernel per access width: V is the widest unsigned type whose size
// divides the row's bytes and both base addresses, so every load and store is naturally aligned.

template <typename V>
__device__ void gather(const V* __restrict__ table, unsigned long long row_vecs,
                       const unsigned* __restrict__ indices, const unsigned* __restrict__ positions,
                       unsigned long long count, V* __restrict__ out) {
    const unsigned long long total = count * row_vecs;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const unsigned long long k = e / row_vecs;
        const unsigned long long j = e - k * row_vecs;
        const unsigned long long to = positions != nullptr ? positions[k] : k;
        out[to * row_vecs + j] = table[(unsigned long long)indices[k] * row_vecs + j];
    }
}

#define CUDA_PINNED_GATHER(NAME, V)                                                                            \
    extern "C" __global__ void NAME(const V* table, unsigned long long row_vecs, const unsigned* indices,    \
                                    const unsigned* positions, unsigned long long count, V* out) {         \
        gather(table, row_vecs, indices, positions, count, out);                                            \
    }

CUDA_PINNED_GATHER(cuda_pinned_gather_1, unsigned char)
CUDA_PINNED_GATHER(cuda_pinned_gather_2, unsigned short)
CUDA_PINNED_GATHER(cuda_pinned_gather_4, unsigned int)
CUDA_PINNED_GATHER(cuda_pinned_gather_8, unsigned long long)
CUDA_PINNED_GATHER(cuda_pinned_gather_16, uint4)
