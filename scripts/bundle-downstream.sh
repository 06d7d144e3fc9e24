#!/usr/bin/env bash
# Adds the downstream crate's GPU tests (examples/downstream, built with features gpu and cudarc, release) to a
# GPU bundle in .gpu/tests/ as `downstream_on_the_gpu`, so that `.gpu/run.sh` and scripts/gpu-sanitize.sh run
# them beside the workspace's. Needs CUDA_PATH (nvcc compiles the crate's kernels). Run after the bundle is made.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu/tests ] || { echo "error: no .gpu/tests: build the GPU bundle first" >&2; exit 1; }
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
exe=$(CARGO_TARGET_DIR=$target/downstream-gpu cargo test --release --manifest-path examples/downstream/Cargo.toml \
  --features cudarc --no-run --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "on_the_gpu":
        print(m["executable"])
')
[ -n "$exe" ] || { echo "error: the downstream crate built no on_the_gpu test binary" >&2; exit 1; }
cp "$exe" .gpu/tests/downstream_on_the_gpu
strip --strip-debug .gpu/tests/downstream_on_the_gpu 2>/dev/null || true
echo "  .gpu/tests/downstream_on_the_gpu"
