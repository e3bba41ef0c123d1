#!/usr/bin/env bash
# kiln serve's HTTP tests (run by ctest; tests/serve/):
#   sdk   the official openai and anthropic SDKs against kiln serve (pip-installed into BUILD/serve-venv)
#   ops   weight updates, disconnects, the queue limit, SIGTERM, 1,000 concurrent streams (stdlib only)
#   page  the web chat page in headless Chromium (Debian's chromium), with a screenshot BUILD/chat_page.png
# Usage: scripts/serve_tests.sh sdk|ops|page BUILD KILN. Exit 77 (skipped) when a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=$1 BUILD=$2 KILN=$3
export KILN
case "$WHAT" in
  sdk)
    VENV="$BUILD/serve-venv"
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai, anthropic" 2>/dev/null; then
      python3 -m venv "$VENV" || { echo "skipped: python3 -m venv failed (install python3-venv)"; exit 77; }
      "$VENV/bin/pip" install -q --disable-pip-version-check openai anthropic ||
        { echo "skipped: could not pip-install openai and anthropic"; exit 77; }
    fi
    "$VENV/bin/python" -c "import openai, anthropic; print('openai', openai.__version__, 'anthropic', anthropic.__version__)"
    exec "$VENV/bin/python" -m unittest -v tests/serve/test_sdk.py ;;
  ops)
    exec python3 -m unittest -v tests/serve/test_serve_ops.py ;;
  page)
    exec python3 tests/serve/check_chat_page.py --kiln "$KILN" --model testdata/tiny-tools \
      --expect "Hello! How can I help you today?" --query temperature=0 --screenshot "$BUILD/chat_page.png" ;;
  *) echo "usage: $0 sdk|ops|page BUILD KILN" >&2; exit 2 ;;
esac
