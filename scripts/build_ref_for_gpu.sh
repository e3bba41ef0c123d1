#!/usr/bin/env bash
# Builds the benchmark binaries of another revision (the reference a change is measured against)
# for the GPU machine, and packs them as .carry/gpu-ref.tar.xz (build-ref/bin/...), which
# `scripts/gpu_check.sh ab` runs beside this checkout's build in the same call.
# It builds in build-gpu (scripts/build_for_gpu.sh configures it) with REV checked out, so only the
# files that differ from the checkout recompile, then checks the checkout out again and rebuilds
# those targets. The tracked files must be committed first (untracked ones are left alone).
# Usage: scripts/build_ref_for_gpu.sh REV [targets]   (default: bench_decode_step bench_engine bench_linear)
set -euo pipefail
# One function, parsed whole before it runs: the checkout below may replace this file.
main() {
  cd "$(dirname "$0")/.."
  REV=${1:?usage: scripts/build_ref_for_gpu.sh REV [targets]}
  shift
  TARGETS=${*:-bench_decode_step bench_engine bench_linear}
  [ -d build-gpu ] || { echo "build-gpu does not exist: run scripts/build_for_gpu.sh first"; exit 1; }
  [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit or stash the tracked changes first"; exit 1; }
  git rev-parse --verify -q "$REV^{commit}" >/dev/null || { echo "no such revision: $REV"; exit 1; }
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
  HERE=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
  STAGE=$(mktemp -d)
  restore() {
    git checkout -q "$HERE"
    rm -rf "$STAGE"
  }
  trap restore EXIT
  git checkout -q --detach "$REV"
  ninja -C build-gpu $TARGETS
  mkdir -p "$STAGE/build-ref/bin"
  for t in $TARGETS; do cp "build-gpu/bin/$t" "$STAGE/build-ref/bin/"; done
  git checkout -q "$HERE"
  mkdir -p .carry
  tar -C "$STAGE" -cf - build-ref | xz -6 -T2 > .carry/gpu-ref.tar.xz
  echo "reference $(git rev-parse --short "$REV"): .carry/gpu-ref.tar.xz ($(du -h .carry/gpu-ref.tar.xz | cut -f1))"
  # The checkout's own binaries again (build-gpu now holds REV's).
  ninja -C build-gpu $TARGETS
}
main "$@"
