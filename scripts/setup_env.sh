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
# img2dataset (the downloader users run before the build) does not co-install
# with the lock (it needs pandas<3, opencv<5): its own venv, pinned, used by
# the interop tests as a command-line tool. Output goes to a log, not the console.
I2D=.venv-img2dataset
i2d_stamp="$I2D/.installed-$(sha256sum requirements/img2dataset.txt | cut -c1-16)"
if [ ! -f "$i2d_stamp" ]; then
  [ -x "$I2D/bin/python" ] || "$PYTHON" -m venv "$I2D"
  if ! "$I2D/bin/python" -m pip install --quiet --no-deps -r requirements/img2dataset.txt >"$I2D/install.log" 2>&1; then
    echo "error: installing img2dataset into $I2D failed; see $I2D/install.log" >&2
    exit 1
  fi
  touch "$i2d_stamp"
fi
