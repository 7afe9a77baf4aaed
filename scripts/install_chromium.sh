#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for tests/pipeline/audit/test_report_browser.py.
# Idempotent: does nothing when /usr/bin/chromium already exists. Needs root
# (or sudo) and Debian's package index; never downloads a browser build of its own.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install_chromium.sh: not root and no sudo; cannot install chromium" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
log="${TMPDIR:-/tmp}/alt_text_corpus_chromium_install.log"
echo "installing Debian's chromium for the report browser test (log: $log)"
if ! { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core; } >"$log" 2>&1; then
  echo "install_chromium.sh: apt-get failed; see $log" >&2
  exit 1
fi
echo "chromium installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
