/* What bindgen reads to generate src/bindings.rs: the CUDA driver API and the runtime's host-memory
 * entry points. build.rs holds the allowlist of what the crate uses. */
#include <cuda.h>
#include <cuda_runtime_api.h>
