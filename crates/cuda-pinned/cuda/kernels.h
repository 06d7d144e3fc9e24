/*
 * Launchers for the kernels in kernels.cu, which the crate and its tests use.
 *
 * Plain C so that bindings can be written against it and it can be included from C, C++ and
 * CUDA alike. The stream type is spelled `struct CUstream_st *`, the type that both
 * cudaStream_t and the driver API's CUstream name, so this header needs no CUDA header and a
 * stream created through either API can be passed.
 *
 * Every launcher enqueues its work on `stream` and returns without waiting for it. The return
 * value is a cudaError_t: the error of enqueueing (cudaGetLastError() after the launch), 0 on
 * success. Errors that happen while the kernel runs surface later, at the next synchronisation.
 * The context that owns `stream` must be current on the calling thread: the statically linked
 * runtime launches into the current context. Pointers are device pointers (or pointers the
 * device can access) unless said otherwise; NULL stream means the legacy default stream.
 */
#ifndef CUDA_PINNED_KERNELS_H
#define CUDA_PINNED_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Declared at file scope so that the prototypes below all name this one type in C too. */
struct CUstream_st;

/* dst[i] = value for i in [0, n); n counts elements. n == 0 enqueues nothing and returns 0. */
int cuda_pinned_fill_u8(uint8_t *dst, uint8_t value, size_t n, struct CUstream_st *stream);
int cuda_pinned_fill_u16(uint16_t *dst, uint16_t value, size_t n, struct CUstream_st *stream);
int cuda_pinned_fill_u32(uint32_t *dst, uint32_t value, size_t n, struct CUstream_st *stream);
int cuda_pinned_fill_u64(uint64_t *dst, uint64_t value, size_t n, struct CUstream_st *stream);

/*
 * y[i] = a * x[i] + y[i] for i in [0, n). The device may fuse the multiply and add into one
 * FMA (single rounding), so a host reference must allow about 1 ulp of difference.
 * n == 0 enqueues nothing and returns 0.
 */
int cuda_pinned_axpy_f32(float a, const float *x, float *y, size_t n, struct CUstream_st *stream);

/*
 * Writes the 64-bit checksum of the bytes [data, data + len) to the device location *out,
 * with the definition that the Rust function cuda_pinned::kernels::checksum reproduces on the
 * host. `data` may have any alignment. *out is zeroed on `stream` first, so it need not be
 * initialised; len == 0 still launches and leaves the checksum of the empty range in *out.
 */
int cuda_pinned_checksum(const void *data, size_t len, uint64_t *out, struct CUstream_st *stream);

/*
 * Keeps `stream` busy for at least `ns` nanoseconds of the GPU's global timer with one thread
 * that sleeps between reads of the timer, so it takes almost no GPU resources. The timer may
 * tick only every microsecond or so, so the wait can overshoot by that much. Long spins on a
 * GPU that drives a display can be killed by the display watchdog.
 */
int cuda_pinned_spin(uint64_t ns, struct CUstream_st *stream);

/*
 * Loads this file's kernels into the calling thread's current context, as their first launch
 * would, and returns the error (0 for success). Loading a module waits until all work on the
 * device has finished, so the crate does it on a thread of its own, never at a launch.
 */
int cuda_pinned_preload(void);

/*
 * cudaGetErrorName / cudaGetErrorString of `code` from the statically linked runtime: static
 * strings that must not be freed. They need no GPU or context and accept any int: for a code
 * the runtime does not know, both return "unrecognized error code".
 */
const char *cuda_pinned_error_name(int code);
const char *cuda_pinned_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_PINNED_KERNELS_H */
