#!/usr/bin/env bash
# The whole test suite: set-up (packages + build) as scripts/setup.sh does, then every test.
# GPU tests skip with a visible reason on machines without a GPU.
# Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
bash scripts/setup.sh "$BUILD" >/dev/null
# What only the tests need: venv (the serve tests' openai / anthropic SDKs) and chromium (the chat page).
TEST_PACKAGES="python3-venv chromium"
missing=""
for p in $TEST_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
ninja -C "$BUILD"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)"
