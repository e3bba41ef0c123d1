#!/usr/bin/env bash
# Builds the CPU test suite with AddressSanitizer and UndefinedBehaviorSanitizer (g++, build-asan/)
# and runs it, then kiln serve's operations tests against the sanitized binary (weight updates,
# disconnects, malformed requests, 1,000 streams; the server must exit 0 on SIGTERM, which it cannot
# with a leak or a sanitizer report); any report fails the run (UBSan does not recover, ASan checks
# leaks at exit). MPI is left out: OpenMPI's own allocations at exit read as leaks to LeakSanitizer, so
# the data-parallel tests skip here.
# Usage: scripts/sanitize.sh [gtest filter]
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-asan
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_CUDA=OFF -DKILN_MPI=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
ninja -C "$out" kiln kiln_tests
# allocator_may_return_null: kiln turns a failed allocation into an out-of-memory status (tested).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# The CLI tests run the kiln binary of this build (KILN_BINARY is compiled into the suite).
"$out/tests/kiln_tests" --gtest_brief=1 ${1:+--gtest_filter="$1"}
# With a filter only the selected tests run (and the script still exits 0 when they pass).
if [ -z "${1:-}" ]; then KILN_SANITIZED=1 KILN="$out/bin/kiln" python3 -m unittest tests/serve/test_serve_ops.py; fi
