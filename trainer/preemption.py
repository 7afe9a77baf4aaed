"""Preemption: SIGTERM becomes a flag, and every host agrees on the step at which the run stops.

The trainer saves a checkpoint at that step and its command line exits with
``EXIT_PREEMPTED``.
"""

from __future__ import annotations

import signal

import jax
import numpy as np
from absl import logging

#: Exit status of a command-line run stopped by SIGTERM after saving a
#: checkpoint: "preempted, resume me" (sysexits' EX_TEMPFAIL: a temporary
#: failure, retry). 0 means the run reached total_steps; 1 is an error.
EXIT_PREEMPTED = 75


class StopOnSigterm:
    """Turns SIGTERM into a flag; ``agreed()`` is the preemption sync point.

    Hosts receive the signal at different steps (or only some of them do).
    After every step each host calls ``agreed()``: with several processes it
    is an all-gather of the hosts' flags (a few bytes, one collective per
    step), so every host sees the same answer at the same step, saves the same
    checkpoint and stops together. With one process it is the local flag.
    """

    requested = False

    def _handle(self, signum, frame):
        self.requested = True

    def agreed(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.asarray(self.requested, np.int32))
        return bool(np.any(flags))

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None
            logging.warning("not in the main thread: SIGTERM will not checkpoint")
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False
