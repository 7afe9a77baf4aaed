#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with pinned versions.
# Idempotent and quiet when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.installed-$(cat setup.py requirements/lock.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet -c requirements/lock.txt -e ".[all]"
  touch "$stamp"
fi
