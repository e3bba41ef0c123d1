#!/usr/bin/env bash
# Builds on the CPU machine the binaries the GPU machine runs: sm_90a CUDA, OpenBLAS linked
# statically (the GPU image has no Debian packages), MPI against Debian's OpenMPI 4.1 (the GPU
# image's OpenMPI 4.1.6 has the same libmpi.so.40). The result, build-gpu/, is carried with the
# `device` tool (carry: [".carry"], as .carry/gpu-build.tar.xz); scripts/gpu_check.sh runs it there.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_STATIC_BLAS=ON -DKILN_MPI=ON >/dev/null
BINS="bench_engine bench_decode_step bench_attention bench_ops bench_linear bench_gemv_floor bench_persistent_chain bench_train bench_attention_train bench_rl bench_serve"
ninja -C build-gpu kiln kiln_tests kiln_gpu_tests $BINS
mkdir -p .carry
rm -f .carry/gpu-inc.tar.xz  # a full build replaces any incremental one
cp ../shared/reference/hf_bench.py .carry/ 2>/dev/null || true
# The binaries share most of their bytes (CUDA kernels, static OpenBLAS): one xz archive with a 64 MiB window holds each shared part once.
tar -cf - build-gpu/bin/kiln $(for b in $BINS; do echo build-gpu/bin/$b; done) \
    build-gpu/share build-gpu/tests/kiln_tests build-gpu/tests/kiln_gpu_tests | xz -9 -T2 > .carry/gpu-build.tar.xz
ls -la .carry
