#!/usr/bin/env bash
# Packages the publishable crates (cuda-pinned-sys, cuda-pinned-sim, cuda-pinned), unpacks them into
# <target>/packaged and runs their tests there, as a user who downloaded them would: each unpacked crate
# depends on the other unpacked packages (a [patch.crates-io] stands in for the registry), not on the sources.
# Arguments are passed to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
crates=(cuda-pinned-sys cuda-pinned-sim cuda-pinned)
version() { sed -n 's/^version = "\(.*\)"/\1/p' "crates/$1/Cargo.toml"; }

args=()
for crate in "${crates[@]}"; do args+=(-p "$crate"); done
# --no-verify: the unpacked packages are built and tested below, against each other rather than a registry.
cargo package "${args[@]}" --no-verify --allow-dirty

packaged=$target/packaged
rm -rf "$packaged"
mkdir -p "$packaged"
members=()
for crate in "${crates[@]}"; do
  tar xzf "$target/package/$crate-$(version "$crate").crate" -C "$packaged"
  members+=("\"$crate-$(version "$crate")\"")
done
{
  echo "[workspace]"
  echo "members = [$(IFS=,; echo "${members[*]}")]"
  echo 'resolver = "3"'
  echo
  echo "[patch.crates-io]"
  for crate in cuda-pinned-sys cuda-pinned-sim; do
    echo "$crate = { path = \"$crate-$(version "$crate")\" }"
  done
} > "$packaged/Cargo.toml"
cd "$packaged"
CARGO_TARGET_DIR="$packaged/target" cargo test --workspace "$@"
