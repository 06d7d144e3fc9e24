// Small kernels that the crate and its tests use (fills, axpy, a checksum that lets a test
// verify a transfer without copying the data back, and a timed spin that keeps a stream busy
// in overlap and race tests), with the extern "C" launchers declared in kernels.h.
//
// Launchers only enqueue and return the launch error (see kernels.h). build.rs compiles this
// file through the cc crate into SASS for sm_75, sm_80 and sm_90 plus compute_90 PTX, which
// newer GPUs JIT-compile, and links the CUDA runtime statically.

#include "kernels.h"

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "kernels.cu needs sm_70 or newer (__nanosleep, %globaltimer)"
#endif

static_assert(sizeof(uint64_t) == sizeof(unsigned long long),
              "atomicAdd on the checksum needs uint64_t to be a 64-bit unsigned long long");

namespace {

constexpr unsigned kBlock = 256;
// Enough resident blocks to fill the largest target (132 SMs of an H100, 8 blocks of 256
// threads each) four times over; beyond that, grid-stride loops cover the rest, so launches of
// any 64-bit size stay within gridDim.x limits and don't pay for millions of tiny blocks.
constexpr unsigned kMaxGrid = 4 * 132 * 8;

unsigned grid_for(size_t items) {
  // Division first: items + kBlock - 1 could wrap for sizes near SIZE_MAX.
  const size_t blocks = items / kBlock + (items % kBlock != 0);
  if (blocks == 0) return 1;
  return blocks < kMaxGrid ? static_cast<unsigned>(blocks) : kMaxGrid;
}

// size_t throughout: 32-bit indices would wrap on multi-GiB buffers.
__device__ __forceinline__ size_t global_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t grid_threads() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__global__ void fill_kernel(T *__restrict__ dst, T value, size_t n) {
  for (size_t i = global_thread(); i < n; i += grid_threads()) dst[i] = value;
}

__global__ void axpy_kernel(float a, const float *__restrict__ x, float *__restrict__ y,
                            size_t n) {
  // nvcc contracts this to an FMA by default (--fmad=true), so the result may be fused and
  // differ from a separately rounded host computation by about 1 ulp.
  for (size_t i = global_thread(); i < n; i += grid_threads()) y[i] = a * x[i] + y[i];
}

// The checksum. Its definition is shared with the Rust host function
// cuda_pinned::kernels::checksum, which must compute the same value bit for bit:
//   mix64: the SplitMix64 finaliser
//   w_k    = little-endian u64 of data[8k .. 8k+8), bytes past len taken as 0
//   term_k = mix64(w_k ^ (k * kGolden))
//   sum    = mix64(len) + sum_k term_k        (all arithmetic mod 2^64)
// A sum of independent terms lets threads reduce in any order; mixing in k makes the result
// depend on where each word sits, and mix64(len) on how many zero bytes trail.
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

__global__ void checksum_kernel(const unsigned char *__restrict__ data, size_t len,
                                unsigned long long *__restrict__ out) {
  const size_t full_words = len / 8;
  const size_t words = full_words + (len % 8 != 0);
  // data + 8k is 8-aligned for every k exactly when data is, so one test covers all words.
  const bool aligned = (reinterpret_cast<uintptr_t>(data) & 7) == 0;

  const size_t tid = global_thread();
  // Added once, by one thread; the launch always has at least one block, so also for len == 0.
  uint64_t sum = tid == 0 ? mix64(len) : 0;
  for (size_t k = tid; k < words; k += grid_threads()) {
    const size_t base = 8 * k;
    uint64_t w;
    if (aligned && k < full_words) {
      // The GPU is little-endian, so the word loads as the definition reads it.
      w = *reinterpret_cast<const uint64_t *>(data + base);
    } else {
      // Misaligned or the final partial word: a wide load would fault or read past len.
      w = 0;
#pragma unroll
      for (unsigned j = 0; j < 8; ++j) {
        if (base + j < len) w |= static_cast<uint64_t>(data[base + j]) << (8 * j);
      }
    }
    sum += mix64(w ^ (k * kGolden));
  }

  // Every thread reaches this point (no early exit) and blocks are whole warps, so the full
  // mask is right.
#pragma unroll
  for (unsigned offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  }
  // Adding 0 changes nothing, so warps without words skip the atomic.
  if ((threadIdx.x & 31) == 0 && sum != 0) atomicAdd(out, static_cast<unsigned long long>(sum));
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  // volatile: each read must happen, in order, and not be hoisted out of the wait loop.
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t start = global_timer_ns();
  // Unsigned difference: correct even if the timer wraps.
  while (global_timer_ns() - start < ns) {
    // Yields the SM's issue slots to kernels this one is meant to overlap with; about the
    // timer's own resolution, so it costs little accuracy.
    __nanosleep(1000);
  }
}

template <typename T>
int launch_fill(T *dst, T value, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(dst, value, n);
  return cudaGetLastError();
}

// cudaError has no fixed underlying type, so converting an int outside the range of its
// enumerators (0 to 16383, as cudaErrorApiFailureBase is 10000) to it is undefined behaviour.
// Such codes are replaced by 16383, which is in range and no error, so the runtime answers
// for them as for any other unknown code.
cudaError_t to_cuda_error(int code) {
  constexpr int kLast = 0x3FFF;
  return static_cast<cudaError_t>(code >= 0 && code <= kLast ? code : kLast);
}

}  // namespace

extern "C" {

int cuda_pinned_fill_u8(uint8_t *dst, uint8_t value, size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}

int cuda_pinned_fill_u16(uint16_t *dst, uint16_t value, size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}

int cuda_pinned_fill_u32(uint32_t *dst, uint32_t value, size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}

int cuda_pinned_fill_u64(uint64_t *dst, uint64_t value, size_t n, cudaStream_t stream) {
  return launch_fill(dst, value, n, stream);
}

int cuda_pinned_axpy_f32(float a, const float *x, float *y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  axpy_kernel<<<grid_for(n), kBlock, 0, stream>>>(a, x, y, n);
  return cudaGetLastError();
}

int cuda_pinned_checksum(const void *data, size_t len, uint64_t *out, cudaStream_t stream) {
  const cudaError_t err = cudaMemsetAsync(out, 0, sizeof *out, stream);
  if (err != cudaSuccess) {
    // Clear it, or the next launcher's cudaGetLastError() would report it again.
    (void)cudaGetLastError();
    return err;
  }
  const size_t words = len / 8 + (len % 8 != 0);
  checksum_kernel<<<grid_for(words), kBlock, 0, stream>>>(
      static_cast<const unsigned char *>(data), len, reinterpret_cast<unsigned long long *>(out));
  return cudaGetLastError();
}

int cuda_pinned_spin(uint64_t ns, cudaStream_t stream) {
  // ns == 0 still launches: the stream then holds an (empty) kernel, as callers would expect
  // of a launch, and it checks that launching works at all.
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

int cuda_pinned_preload(void) {
  // Asking for a kernel's attributes makes the runtime load this file's module into the current
  // context, which is what the first launch would otherwise do (and loading a module waits for
  // all work on the device). One call loads the whole module; each kernel is asked for all the
  // same, so that lazy loading of single functions happens here too.
  cudaFuncAttributes attributes;
  const void *kernels[] = {
      reinterpret_cast<const void *>(&fill_kernel<uint8_t>),
      reinterpret_cast<const void *>(&fill_kernel<uint16_t>),
      reinterpret_cast<const void *>(&fill_kernel<uint32_t>),
      reinterpret_cast<const void *>(&fill_kernel<uint64_t>),
      reinterpret_cast<const void *>(&axpy_kernel),
      reinterpret_cast<const void *>(&checksum_kernel),
      reinterpret_cast<const void *>(&spin_kernel),
  };
  for (const void *kernel : kernels) {
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return err;
    }
  }
  return cudaSuccess;
}

const char *cuda_pinned_error_name(int code) { return cudaGetErrorName(to_cuda_error(code)); }

const char *cuda_pinned_error_string(int code) { return cudaGetErrorString(to_cuda_error(code)); }

}  // extern "C"
