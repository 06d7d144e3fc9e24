#!/usr/bin/env bash
# Runs the bundled GPU test binaries (.gpu/tests/*, built with --features gpu; the simulator-only ones, sim_*,
# have no test there) under compute-sanitizer's memcheck, racecheck and synccheck, on the CUDA machine, from the
# repository root:
#
#   bash scripts/gpu-sanitize.sh [OUT_DIR]     logs go to OUT_DIR (default: ./sanitize-logs)
#
# API errors are not reported: the suites provoke them on purpose (out of memory, NOT_READY from queries,
# timing an event made without timing), and compute-sanitizer would count each as an error. Each binary runs
# with --test-threads=1. Exits non-zero if any run reports an error or a hazard, or a test fails.
set -uo pipefail
out=${1:-sanitize-logs}
mkdir -p "$out"
failed=0
for tool in memcheck racecheck synccheck; do
  for t in .gpu/tests/*; do
    case $(basename "$t") in sim_* | lib | loader | pinbench) continue ;; esac
    log=$out/$tool.log
    echo "=== $tool $(basename "$t")" >> "$log"
    compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 "$t" --test-threads=1 > /tmp/sanitize.$$ 2>&1
    rc=$?
    cat /tmp/sanitize.$$ >> "$log"
    echo "$tool $(basename "$t"): exit $rc | $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' /tmp/sanitize.$$ | tr '\n' ' ')"
    [ "$rc" = 0 ] || failed=$((failed + 1))
  done
done
rm -f /tmp/sanitize.$$
echo "sanitizers: $failed failing runs"
[ "$failed" = 0 ]
