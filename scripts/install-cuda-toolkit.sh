#!/usr/bin/env bash
# Installs a CUDA 13.0 toolkit (nvcc, headers, static runtime) from NVIDIA's PyPI wheels into ./.cuda,
# so that `--features gpu` builds on a machine with no CUDA installed. Idempotent: a second run with the
# same versions does nothing. The toolkit root is .cuda/nvidia/cu13; build.rs finds it there.
#
#   scripts/install-cuda-toolkit.sh            install (or do nothing if already installed)
#   CUDA_PINNED_TOOLKIT_DIR=DIR scripts/...    install into DIR instead of ./.cuda
#
# CUDA 13.0 code runs on drivers >= 580.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
dest=${CUDA_PINNED_TOOLKIT_DIR:-$top/.cuda}
packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-nvvm==13.0.88
)
stamp=$dest/.installed
want="${packages[*]}"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dest/nvidia/cu13/bin/nvcc" ]; then
  echo "CUDA toolkit already installed in $dest/nvidia/cu13"
  exit 0
fi

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "error: $python not found; the toolkit installs from PyPI with pip" >&2; exit 1; }

rm -rf "$dest"
mkdir -p "$dest"
echo "installing ${packages[*]} into $dest"
"$python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps \
  --target "$dest" "${packages[@]}"

root=$dest/nvidia/cu13
[ -x "$root/bin/nvcc" ] || { echo "error: nvcc missing from $root/bin after install" >&2; exit 1; }
# nvcc looks for cicc and libdevice under its own root (nvvm/); the nvvm wheel puts them there.
[ -d "$root/nvvm" ] || { echo "error: nvvm missing from $root after install" >&2; exit 1; }
# The runtime wheel ships only versioned shared objects; nvcc and the linker want the plain names.
for lib in "$root"/lib/libcudart.so.*; do
  [ -e "$lib" ] && [ ! -e "$root/lib/libcudart.so" ] && ln -s "$(basename "$lib")" "$root/lib/libcudart.so"
done
# Some wheels put lib64 content under lib; nvcc's default search includes lib64.
[ -e "$root/lib64" ] || ln -s lib "$root/lib64"

echo "$want" > "$stamp"
"$root/bin/nvcc" --version | tail -n 2
echo "CUDA toolkit installed: export CUDA_PATH=$root"
