#!/usr/bin/env bash
# Compiles crates/cuda-pinned/cuda/gather.cu to the PTX the crate embeds (crates/cuda-pinned/src/gather.ptx):
#
#   scripts/gather-ptx.sh update   rewrite the PTX (after a change to gather.cu)
#   scripts/gather-ptx.sh check    fail if the committed PTX differs from what gather.cu compiles to
#
# Needs nvcc: CUDA_PATH, or the toolkit that scripts/install-cuda-toolkit.sh installs into .cuda/.
# compute_75 (Turing) is the oldest architecture CUDA 13 compiles for; the driver compiles the PTX for the
# device it loads on.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${CUDA_PATH:-$PWD/.cuda/nvidia/cu13}/bin/nvcc
[ -x "$nvcc" ] || { echo "gather-ptx: no nvcc at $nvcc (set CUDA_PATH or run scripts/install-cuda-toolkit.sh)" >&2; exit 1; }
src=crates/cuda-pinned/cuda/gather.cu
dst=crates/cuda-pinned/src/gather.ptx
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
"$nvcc" -ptx -arch=compute_75 -O3 "$src" -o "$tmp"
# The header names the compiler build and the source path: keep only what the driver reads.
grep -v '^//' "$tmp" > "$tmp.ptx" && mv "$tmp.ptx" "$tmp"
case ${1:-check} in
  update) cp "$tmp" "$dst"; echo "gather-ptx: wrote $dst" ;;
  check) cmp -s "$tmp" "$dst" || { echo "gather-ptx: $dst is not what $src compiles to; run scripts/gather-ptx.sh update" >&2; exit 1; }; echo "gather-ptx: $dst is current" ;;
  *) echo "usage: $0 update|check" >&2; exit 2 ;;
esac
