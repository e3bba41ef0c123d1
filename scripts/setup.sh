#!/usr/bin/env bash
# One-command set-up on a fresh Debian 12 machine: installs the Debian packages kiln builds with,
# configures and builds (CUDA too where nvcc is installed), then runs kiln demo (a tiny model taught
# addition by SFT and then GRPO on kiln's engine, in about half a minute on two cores).
# Usage: scripts/setup.sh [build-dir]      (root, or sudo available, for apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PACKAGES="cmake ninja-build g++ nlohmann-json3-dev libcli11-dev libopenblas-dev libgtest-dev libpcre2-dev libutf8proc-dev libtomlplusplus-dev zlib1g-dev libboost-dev libopenmpi-dev openmpi-bin"
bash scripts/install_packages.sh $PACKAGES
# nvcc lives outside PATH on a default CUDA install.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD" kiln
"$BUILD/bin/kiln" demo
