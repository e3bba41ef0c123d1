#!/usr/bin/env bash
# Builds kiln's libFuzzer targets (fuzz/*_fuzz.cpp) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer (build-fuzz/, CPU only) and runs each for SECONDS over a working corpus
# seeded from fuzz/corpus/<target>/, with fuzz/<target>.dict as libFuzzer's dictionary where it
# exists. Crashes, leaks and hangs stop a target and leave the input in
# build-fuzz/artifacts/<target>/; once fixed, commit it as fuzz/corpus/<target>/regress-<what> so
# the test suite replays it.
# Usage: scripts/fuzz.sh [SECONDS=60] [TARGET...]   (targets: the file names without _fuzz.cpp;
#        default all). PARALLEL=N runs N targets at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"; shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cpp; do b=$(basename "$f"); targets+=("${b%_fuzz.cpp}"); done
fi
CC="${CC:-clang-14}"; CXX="${CXX:-clang++-14}"
command -v "$CXX" >/dev/null || { CC=clang; CXX=clang++; }
out=build-fuzz
cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DKILN_CUDA=OFF -DKILN_TESTS=OFF -DKILN_FUZZ=ON \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link" >/dev/null
ninja -C "$out" $(for t in "${targets[@]}"; do echo "${t}_fuzz"; done)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export KILN_TESTDATA="$PWD/testdata"
run() {
  local t=$1 corpus="$out/corpus/$1" art="$out/artifacts/$1/"
  mkdir -p "$corpus" "$art"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  local rc=0
  local dict=(); [ -f "fuzz/$1.dict" ] && dict=(-dict="fuzz/$1.dict")  # tokens of the format, where a target has them
  "$out/bin/${t}_fuzz" "${dict[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$art" -print_final_stats=1 "$corpus" > "$out/$t.log" 2>&1 || rc=$?
  echo "$t: exit $rc; $(grep -E '^stat::number_of_executed_units' "$out/$t.log" | awk '{print $2}') executions," \
       "$(grep -oE 'cov: [0-9]+' "$out/$t.log" | tail -1) edges, corpus $(ls "$corpus" | wc -l) inputs (log: $out/$t.log)"
  return $rc
}
status=0
pids=()
for t in "${targets[@]}"; do
  run "$t" & pids+=($!)
  if [ ${#pids[@]} -ge "${PARALLEL:-1}" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
