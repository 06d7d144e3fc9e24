#!/usr/bin/env bash
# Regenerates the sys bindings from the CUDA headers of the toolkit build.rs finds (feature `bindgen`,
# needs libclang) and compares them with the committed src/sys/bindings.rs.
#
#   scripts/bindings.sh check    exit 1 and show the diff if the committed file differs (CI runs this)
#   scripts/bindings.sh update   overwrite the committed file with the regenerated one
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
case "$mode" in check|update) ;; *) echo "usage: $0 check|update" >&2; exit 2 ;; esac

# build.rs writes the regenerated file to its OUT_DIR; cargo names that directory in its JSON messages.
out_dir=$(cargo check --quiet --features bindgen --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and m["package_id"].startswith("path+"):
        print(m["out_dir"])
' | tail -n 1)
fresh=$out_dir/bindings.rs
[ -f "$fresh" ] || { echo "error: cargo check --features bindgen wrote no $fresh" >&2; exit 1; }

if [ "$mode" = update ]; then
  cp "$fresh" src/sys/bindings.rs
  echo "src/sys/bindings.rs updated from $fresh"
elif diff -u src/sys/bindings.rs "$fresh"; then
  echo "bindings: src/sys/bindings.rs matches what bindgen generates from the headers"
else
  echo "error: src/sys/bindings.rs differs from what bindgen generates (diff above); run scripts/bindings.sh update" >&2
  exit 1
fi
