#!/usr/bin/env bash
# The test command: installs what it needs (venv, pinned packages, Chromium
# for the browser tests), then runs the default test suite. Extra arguments go
# to pytest: `scripts/test.sh -m integration` runs the heavy integration tests
# (CI runs them after the default suite), `-m slow` the slow end-to-end tests.
# Test files run in PYTEST_WORKERS processes (default 2, one per core here);
# PYTEST_WORKERS=0 runs serially. The default run takes 5:23 on 2 idle AMD EPYC
# cores (a fresh clone).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/install_chromium.sh || echo "warning: Chromium could not be installed; the browser tests will be skipped"
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
