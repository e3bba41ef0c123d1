#!/usr/bin/env bash
# kiln serve's HTTP tests (run by ctest; tests/serve/):
#   sdk   the official openai and anthropic SDKs against kiln serve (pip-installed into BUILD/serve-venv)
#   ops   weight updates, disconnects, the queue limit, SIGTERM, 1,000 concurrent streams (stdlib only)
#   page  the web chat page in headless Chromium (Debian's chromium), with a screenshot BUILD/chat_page.png;
#         then with a template that opens a <think> block and --reasoning-parser (the thinking box,
#         BUILD/chat_page_thinking.png); both against the API's answer to the same request
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
    python3 tests/serve/check_chat_page.py --kiln "$KILN" --model testdata/tiny-tools --compare-api \
      --expect "Hello! How can I help you today?" --query temperature=0 --screenshot "$BUILD/chat_page.png"
    THINK=$(mktemp -d)
    trap 'rm -rf "$THINK"' EXIT
    cp -r testdata/tiny-tools "$THINK/"
    sed -i "s/{{- '<|im_start|>assistant\\\\n' }}/{{- '<|im_start|>assistant\\\\n<think>\\\\n' }}/" "$THINK/tiny-tools/chat_template.jinja"
    grep -q "assistant\\\\n<think>" "$THINK/tiny-tools/chat_template.jinja" || { echo "the think template edit failed"; exit 1; }
    python3 tests/serve/check_chat_page.py --kiln "$KILN" --model "$THINK/tiny-tools" --compare-api \
      --serve-arg=--reasoning-parser --serve-arg=deepseek_r1 --expect "" --query "temperature=0&max_tokens=24" \
      --screenshot "$BUILD/chat_page_thinking.png" ;;
  *) echo "usage: $0 sdk|ops|page BUILD KILN" >&2; exit 2 ;;
esac
