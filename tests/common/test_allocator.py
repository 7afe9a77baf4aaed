"""``common.allocator``: freed picture-sized buffers are reused, not faulted in again, once it has run."""

import subprocess
import sys

import pytest

import repo_root

CHURN = r"""
import resource, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
if sys.argv[1] == "keep":
    from common import allocator
    assert allocator.keep_freed_buffers() and allocator.keep_freed_buffers()  # once, then a no-op
sizes = np.random.default_rng(0).integers(600_000, 3_000_000, size=(200, 3))
def churn():  # a decode, its resampled copy, the encoder's buffer: sizes vary per picture
    for a, b, c in sizes:
        decoded = np.empty(a, np.uint8); decoded[::4096] = 1  # every page touched
        resampled = np.empty(b, np.uint8); resampled[::4096] = 1
        del decoded
        encoded = np.empty(c, np.uint8); encoded[::4096] = 1
        del resampled, encoded
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def minor_faults(mode):
    done = subprocess.run([sys.executable, "-c", CHURN, mode, repo_root.ROOT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused_instead_of_mapped_again():
    plain, kept = minor_faults("plain"), minor_faults("keep")
    assert plain > 20_000  # glibc maps and unmaps them: their pages faulted in again and again
    assert kept < plain / 20
