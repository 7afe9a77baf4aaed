"""glibc's allocator told to keep the large buffers a picture's decode and resample free again.

By default glibc maps every buffer above a threshold that starts at 128 KiB
afresh and unmaps it on free, and gives the top of the heap back to the
system past 128 KiB: a decoded 600x800 picture, its resampled copy and the
encoder's buffers are page-faulted in again for every record (~950 minor
faults and ~2.4 ms of system time per photograph measured, against ~6
faults with the thresholds below). The environment variables
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` do the same but
must be set before the process starts, which a Beam worker's code cannot
do; ``mallopt`` works at any time and covers every arena. The cost: up to
``trim`` bytes of freed memory stay with the process.

Anything other than glibc (musl, macOS) has no ``mallopt`` here: nothing is
changed there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: glibc refuses an mmap threshold above 32 MiB on 64-bit systems (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20

_lock = threading.Lock()
_done = [False]


def keep_freed_buffers() -> bool:
    """Once per process: buffers up to 32 MiB come from the heap, and 256 MiB of freed heap stay; True if set."""
    with _lock:
        if _done[0]:
            return True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        _done[0] = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        return _done[0]
