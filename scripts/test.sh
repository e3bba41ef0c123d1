#!/usr/bin/env bash
# The whole test suite: set-up (packages + build) as scripts/setup.sh does, then every test.
# GPU tests skip with a visible reason on machines without a GPU.
# Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
bash scripts/setup.sh "$BUILD" >/dev/null
# What only the tests need: venv (the serve tests' openai / anthropic SDKs) and chromium (the chat page).
bash scripts/install_packages.sh --no-recommends python3-venv chromium >/dev/null
ninja -C "$BUILD"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)"
