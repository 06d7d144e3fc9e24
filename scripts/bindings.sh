#!/usr/bin/env bash
# Regenerates the sys bindings from the CUDA headers of the toolkit build.rs finds (feature `bindgen`,
# needs libclang) and compares them with the committed crates/cuda-pinned-sys/src/bindings.rs.
#
#   scripts/bindings.sh check    exit 1 and show the diff if the committed file differs (CI runs this)
#   scripts/bindings.sh update   overwrite the committed file with the regenerated one
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
case "$mode" in check|update) ;; *) echo "usage: $0 check|update" >&2; exit 2 ;; esac

# build.rs writes the regenerated file to its OUT_DIR; cargo names that directory in its JSON messages.
out_dir=$(cargo check --quiet -p cuda-pinned-sys --features bindgen --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "cuda-pinned-sys" in m["package_id"]:
        print(m["out_dir"])
' | tail -n 1)
fresh=$out_dir/bindings.rs
committed=crates/cuda-pinned-sys/src/bindings.rs
[ -f "$fresh" ] || { echo "error: cargo check --features bindgen wrote no $fresh" >&2; exit 1; }

if [ "$mode" = update ]; then
  cp "$fresh" $committed
  echo "$committed updated from $fresh"
elif diff -u $committed "$fresh"; then
  echo "bindings: $committed matches what bindgen generates from the headers"
else
  echo "error: $committed differs from what bindgen generates (diff above); run scripts/bindings.sh update" >&2
  exit 1
fi
