#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with pinned versions.
# Idempotent and quiet when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
# pip's own output (and the index warnings some machines' pip config prints)
# goes to a log; the console gets one line per install and a one-line error.
pip_quiet() {  # pip_quiet VENV LOG ARGS...: run pip, output to LOG, one-line error
  local venv=$1 log=$2; shift 2
  if ! "$venv/bin/python" -m pip install --quiet "$@" >>"$log" 2>&1; then
    echo "error: pip install into $venv failed; see $log" >&2
    exit 1
  fi
}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  pip_quiet .venv .venv/install.log --upgrade pip
fi
stamp=".venv/.installed-$(cat setup.py requirements/lock.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "installing pinned packages into .venv (first run: a few minutes; log: .venv/install.log)"
  pip_quiet .venv .venv/install.log -c requirements/lock.txt -e ".[all]"
  touch "$stamp"
fi
# img2dataset (the downloader users run before the build) does not co-install
# with the lock (it needs pandas<3, opencv<5): its own venv, pinned, used by
# the interop tests as a command-line tool. Output goes to a log, not the console.
I2D=.venv-img2dataset
i2d_stamp="$I2D/.installed-$(sha256sum requirements/img2dataset.txt | cut -c1-16)"
if [ ! -f "$i2d_stamp" ]; then
  [ -x "$I2D/bin/python" ] || "$PYTHON" -m venv "$I2D"
  pip_quiet "$I2D" "$I2D/install.log" --no-deps -r requirements/img2dataset.txt
  touch "$i2d_stamp"
fi
