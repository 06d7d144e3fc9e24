#!/usr/bin/env bash
# Packages the publishable crates (cuda-pinned-sys, cuda-pinned-sim, cuda-pinned), unpacks them and tests each
# one as a user who downloaded it would: from the unpacked files, depending on the other crates through a git
# source (a repository of the unpacked packages) as it would through a registry, so that cargo treats them as it
# treats downloaded crates (a dependency's shared library, such as the simulator's, gets a hashed name).
#
# What it proves is what the workspace's own `cargo test` cannot: that each package holds every file its tests
# need, and that the packages build, link and run against each other. So every test target of every package is
# built and linked (a file left out of a package fails there), and what is run is: the whole of the small suites
# of cuda-pinned-sys and cuda-pinned-sim, and of cuda-pinned (whose full suite the workspace's `cargo test`
# runs, minutes of it) the tests that need the package's own files or its dependencies' at run time:
# tests/gpu_context.rs, on the packaged simulator loaded by its hashed name through the packaged
# cuda-pinned-sys, and tests/compile_fail.rs's checks of the programs and their expected errors read from the
# package, but not its compiler comparison (trybuild), which CI runs in steps of its own.
# Arguments, where given, are passed to `cargo test` instead, in every package: `--no-fail-fast` runs each
# package's whole suite, as a user's `cargo test` does.
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

# What `cargo test` runs in each package, after `cargo test --no-run` has built its test targets, examples and
# all, unless arguments are given.
declare -A selected=(
  [cuda-pinned-sys]=""
  [cuda-pinned-sim]=""
  [cuda-pinned]="--test gpu_context --test compile_fail -- --skip safety_claims_are_compile_errors"
)

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
  # Each package finds only the simulator libraries its own build made: cuda-pinned-sim's build makes it under
  # its plain name, which must not stand in for the hashed one in cuda-pinned's test folder, so it has a target
  # folder of its own. cuda-pinned-sys's tests load no simulator: it shares cuda-pinned's (and its builds of
  # their common dependencies).
  case $crate in
    cuda-pinned-sim) target_dir=$packaged/target-sim ;;
    *) target_dir=$packaged/target ;;
  esac
  if [ $# -gt 0 ]; then
    (cd "$copy" && CARGO_TARGET_DIR=$target_dir cargo test "$@")
  else
    # shellcheck disable=SC2086 # the selection's words are separate arguments
    (cd "$copy" && CARGO_TARGET_DIR=$target_dir cargo test --no-run &&
      CARGO_TARGET_DIR=$target_dir cargo test ${selected[$crate]})
  fi
done
