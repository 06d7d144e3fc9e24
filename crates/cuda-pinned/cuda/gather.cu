// The crate's gather kernels (src/gather.rs): rows of a table in page-locked host memory, which the device reads
// in place through its mapping, copied into device memory by index. Output row k is table row indices[k], or,
// where `positions` is not null (indices sorted for locality, the batch's order kept), output row positions[k]
// is table row indices[k].
//
// Compiled to PTX by scripts/gather-ptx.sh (the crate embeds src/gather.ptx and loads it with Module::load, so
// no nvcc is needed to build the crate). One gather kernel per access width: V is the widest unsigned type whose
// size divides the row's bytes and both base addresses, so every load and store is naturally aligned.

// Loads each thread keeps in flight before it stores them (src/gather.rs sizes the grid by it): reads over the
// bus take microseconds, and independent loads per thread fill the link with fewer threads, which leaves the
// device's blocks to the compute beside the gather.
#define UNROLL 4

template <typename V>
__device__ void gather(const V* __restrict__ table, unsigned long long row_vecs,
                       const unsigned* __restrict__ indices, const unsigned* __restrict__ positions,
                       unsigned long long count, V* __restrict__ out) {
    const unsigned long long total = count * row_vecs;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; first < total;
         first += UNROLL * stride) {
        V value[UNROLL];
        unsigned long long to[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned long long e = first + u * stride;
            if (e < total) {
                const unsigned long long k = e / row_vecs;
                const unsigned long long j = e - k * row_vecs;
                to[u] = (positions != nullptr ? positions[k] : k) * row_vecs + j;
                value[u] = table[(unsigned long long)indices[k] * row_vecs + j];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (first + u * stride < total) {
                out[to[u]] = value[u];
            }
        }
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

// Sorting the indices on the device (into `order`: the sorted indices, then each one's position in the batch), by
// bucket: the bucket of an index is the byte offset of its row in the table
// shifted right by `shift`. Counting (bins zeroed before), the sums of tiles of TILE bins, each bin's first slot
// (an exclusive scan, in place), and the scatter into those slots with each index's position in the batch. Within a
// bucket the order is whatever the atomics give: the output does not depend on it. The bins are allocated in whole
// tiles, zeroed past the last bucket, followed by one sum per tile (the grid of the tile kernels is the tiles).
#define SORT_BLOCK 256
#define BINS_PER_THREAD 16
#define TILE (SORT_BLOCK * BINS_PER_THREAD)

__device__ unsigned long long bucket(unsigned index, unsigned long long row_bytes, unsigned long long shift) {
    return ((unsigned long long)index * row_bytes) >> shift;
}

extern "C" __global__ void cuda_pinned_gather_count(const unsigned* indices, unsigned long long count,
                                                    unsigned long long row_bytes, unsigned long long shift,
                                                    unsigned* bins) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride) {
        atomicAdd(&bins[bucket(indices[k], row_bytes, shift)], 1u);
    }
}

// The sum of the block's values (every thread gets it); SORT_BLOCK threads.
__device__ unsigned block_sum(unsigned value) {
    __shared__ unsigned warps[SORT_BLOCK / 32];
    for (int d = 16; d > 0; d /= 2) {
        value += __shfl_xor_sync(0xffffffffu, value, d);
    }
    if (threadIdx.x % 32 == 0) {
        warps[threadIdx.x / 32] = value;
    }
    __syncthreads();
    unsigned sum = 0;
    for (int w = 0; w < SORT_BLOCK / 32; ++w) {
        sum += warps[w];
    }
    __syncthreads();
    return sum;
}

// The thread's BINS_PER_THREAD bins of the block's tile.
__device__ unsigned* thread_bins(unsigned* bins) {
    return bins + (unsigned long long)blockIdx.x * TILE + threadIdx.x * BINS_PER_THREAD;
}

// The tiles' sums, after the grid's tiles of bins.
__device__ unsigned* tile_sums(unsigned* bins) {
    return bins + (unsigned long long)gridDim.x * TILE;
}

extern "C" __global__ void cuda_pinned_gather_tiles(unsigned* bins) {
    const unsigned* mine = thread_bins(bins);
    unsigned sum = 0;
    for (int b = 0; b < BINS_PER_THREAD; ++b) {
        sum += mine[b];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        tile_sums(bins)[blockIdx.x] = sum;
    }
}

extern "C" __global__ void cuda_pinned_gather_starts(unsigned* bins) {
    __shared__ unsigned warps[SORT_BLOCK / 32];
    const unsigned* tiles = tile_sums(bins);
    unsigned before = 0;
    for (unsigned t = threadIdx.x; t < blockIdx.x; t += SORT_BLOCK) {
        before += tiles[t];
    }
    before = block_sum(before);
    unsigned* mine = thread_bins(bins);
    unsigned sum = 0;
    for (int b = 0; b < BINS_PER_THREAD; ++b) {
        sum += mine[b];
    }
    // Inclusive scan of the threads' sums: within each warp, then over the warps' totals.
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned scanned = sum;
    for (unsigned d = 1; d < 32; d *= 2) {
        const unsigned other = __shfl_up_sync(0xffffffffu, scanned, d);
        if (lane >= d) {
            scanned += other;
        }
    }
    if (lane == 31) {
        warps[warp] = scanned;
    }
    __syncthreads();
    for (unsigned w = 0; w < warp; ++w) {
        scanned += warps[w];
    }
    unsigned start = before + scanned - sum;
    for (int b = 0; b < BINS_PER_THREAD; ++b) {
        const unsigned n = mine[b];
        mine[b] = start;
        start += n;
    }
}

extern "C" __global__ void cuda_pinned_gather_scatter(const unsigned* indices, unsigned long long count,
                                                      unsigned long long row_bytes, unsigned long long shift,
                                                      unsigned* bins, unsigned* order) {
    unsigned* sorted = order;
    unsigned* positions = order + count;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride) {
        const unsigned index = indices[k];
        const unsigned slot = atomicAdd(&bins[bucket(index, row_bytes, shift)], 1u);
        sorted[slot] = index;
        positions[slot] = (unsigned)k;
    }
}
