#!/usr/bin/env bash
# Installs the Debian packages named that are missing (apt-get, through sudo when not root).
# Usage: scripts/install_packages.sh [--no-recommends] PACKAGE...   (used by setup.sh and test.sh)
set -euo pipefail
opts=""
if [ "${1:-}" = "--no-recommends" ]; then opts="--no-install-recommends"; shift; fi
missing=""
for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $opts $missing
