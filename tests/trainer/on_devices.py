"""Runs a check in a subprocess whose JAX has several simulated CPU devices (the test process has one).

The test file is also the subprocess's script: ``python FILE NAME`` runs its
check ``NAME`` and prints a JSON line, which ``run_check`` returns.
"""

import json
import os
import subprocess
import sys

from tests.repo_root import ROOT


def run_check(script: str, name: str, devices: int = 8) -> dict:
    """The JSON that ``python script name`` prints last, run with ``devices`` host devices."""
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, os.path.abspath(script), name], env=env,
                            capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
