#!/usr/bin/env bash
# Packages the publishable crates (cuda-pinned-sys, cuda-pinned-sim, cuda-pinned), unpacks them and runs each
# one's tests as a user who downloaded it would: from the unpacked files, depending on the other crates through
# a git source (a repository of the unpacked packages) as it would through a registry, so that cargo treats them
# as it treats downloaded crates (a dependency's shared library, such as the simulator's, gets a hashed name).
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
mkdir -p "$packaged/repository"
for crate in "${crates[@]}"; do
  tar xzf "$target/package/$crate-$(version "$crate").crate" -C "$packaged/repository"
done
git -C "$packaged/repository" init -q
git -C "$packaged/repository" add -A
git -C "$packaged/repository" -c user.name=packages -c user.email=packages@localhost commit -qm "the packages"

for crate in "${crates[@]}"; do
  echo "=== the tests of the $crate package"
  copy=$packaged/$crate
  cp -r "$packaged/repository/$crate-$(version "$crate")" "$copy"
  {
    echo
    echo "[workspace]"
    echo
    echo "[patch.crates-io]"
    for other in "${crates[@]}"; do
      [ "$other" = "$crate" ] || echo "$other = { git = \"file://$packaged/repository\" }"
    done
  } >> "$copy/Cargo.toml"
  # A target folder per package, so that each finds only the libraries its own build made.
  (cd "$copy" && CARGO_TARGET_DIR="$packaged/target-$crate" cargo test "$@")
done
