"""A worker's DNS: answers cached, failures retried, every lookup bounded by the caller's time.

A crawl resolves each host once per ``ttl`` instead of once per URL and
redirect hop: a cloud VM's resolver limits queries per second, and a list of
millions of URLs on thousands of hosts otherwise spends that budget on the
same names again and again, and gets ``dns_error``s back.

- **Cache.** A host's answer is kept ``ttl`` seconds; a failure
  (NXDOMAIN, no address, or a transient failure after its retries) is kept
  ``negative_ttl`` seconds, so a dead host's thousand URLs cost one query.
  At most ``max_entries`` names, least recently used evicted first. The
  answer is cached, not the verdict: ``fetch`` checks every address against
  the policy (``addresses``) each time it uses one, and connects to that
  address (there is no second lookup).
- **One query per name at a time.** Threads that ask for a name being
  looked up wait for that lookup instead of sending their own.
- **Retries.** A transient failure (``EAI_AGAIN`` "temporary failure",
  ``EAI_FAIL``, a timeout, another ``OSError``) is retried ``retries`` times
  after ``backoff``, ``2 * backoff``, ... seconds; "no such name" is an
  answer and is not retried.
- **The caller's deadline.** ``getaddrinfo`` cannot be interrupted, so
  lookups run on a small pool of threads and the caller waits at most until
  its deadline (``dns_timeout``). The lookup goes on and its answer is
  cached for the next URL of that host; a lookup nobody waits for any more
  is dropped if it has not started.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import socket
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

from pipeline.download.addresses import Resolver, system_resolver

#: ``getaddrinfo`` errors that say the name has no address: an answer, not a failure to get one.
_NO_SUCH_NAME = frozenset(
    code for code in (getattr(socket, name, None) for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY"))
    if code is not None
)


@dataclasses.dataclass(frozen=True)
class DnsSettings:
    """A worker's DNS cache and retries; times in seconds."""

    ttl: float = 300.0            # an answer is reused this long
    negative_ttl: float = 60.0    # a failure is remembered this long
    max_entries: int = 65536      # names cached (least recently used evicted)
    retries: int = 2              # more lookups after a transient failure
    backoff: float = 0.5          # before the first retry; doubles
    threads: int = 16             # lookups at once (each blocks a thread in getaddrinfo)


class DnsFailure(Exception):
    """No usable answer: ``reason`` is ``dns_error`` (no address) or ``dns_timeout`` (the deadline passed)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class _Entry:
    expires: float
    answer: Optional[Tuple[Tuple[int, str], ...]]  # None: the name failed


class _Pending:
    """A lookup in progress and how many callers still wait for it."""

    __slots__ = ("future", "waiting")

    def __init__(self, future):
        self.future = future
        self.waiting = 0


class CachingResolver:
    """``resolve(host, port, deadline) -> [(family, ip), ...]`` through a cache; shared by a worker's threads.

    ``lookup`` is the uncached resolver (``addresses.system_resolver``, or a
    test's); ``clock`` the time the TTLs are measured in.
    """

    def __init__(self, lookup: Resolver = system_resolver, settings: DnsSettings = DnsSettings(),
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.lookup = lookup
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._cache: "collections.OrderedDict[str, _Entry]" = collections.OrderedDict()
        self._pending = {}
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self.queries = 0   # lookups sent (retries included)
        self.hits = 0      # answers (or failures) served from the cache

    def __len__(self) -> int:
        return len(self._cache)

    def __call__(self, host: str, port: int) -> List[Tuple[int, str]]:
        """Without a deadline, for code that takes a plain resolver; ``OSError`` if there is no answer."""
        try:
            return self.resolve(host, port)
        except DnsFailure as failure:
            raise OSError(failure.reason) from None

    def resolve(self, host: str, port: int, deadline: float = math.inf) -> List[Tuple[int, str]]:
        """The host's addresses (unchecked); ``DnsFailure`` if none or if ``deadline`` (monotonic) passes."""
        key = host.lower()
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None and entry.expires > self.clock():
                self._cache.move_to_end(key)
                self.hits += 1
                if entry.answer is None:
                    raise DnsFailure("dns_error")
                return list(entry.answer)
            pending = self._pending.get(key)
            if pending is None:
                pending = _Pending(self._executor().submit(self._lookup, key, port))
                self._pending[key] = pending
            pending.waiting += 1
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise concurrent.futures.TimeoutError
            answer = pending.future.result(timeout=None if math.isinf(left) else left)
        except concurrent.futures.TimeoutError:
            raise DnsFailure("dns_timeout") from None
        finally:
            with self._lock:
                pending.waiting -= 1
                if not pending.waiting and pending.future.cancel():  # nobody waits and it has not started
                    self._pending.pop(key, None)
        if answer is None:
            raise DnsFailure("dns_error")
        return list(answer)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.settings.threads, thread_name_prefix="dns")
        return self._pool

    def _lookup(self, key: str, port: int):
        """On a pool thread: the answer (a tuple) or None, cached either way; a bug's exception is not cached."""
        try:
            answer = self._query_with_retries(key, port)
            with self._lock:
                ttl = self.settings.ttl if answer is not None else self.settings.negative_ttl
                if ttl > 0:
                    self._cache[key] = _Entry(self.clock() + ttl, answer)
                    self._cache.move_to_end(key)
                    while len(self._cache) > self.settings.max_entries:
                        self._cache.popitem(last=False)
            return answer
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _query_with_retries(self, key: str, port: int):
        for retry in range(self.settings.retries + 1):
            if retry:
                self.sleep(self.settings.backoff * 2 ** (retry - 1))
            with self._lock:
                self.queries += 1
            try:
                found = _unique(self.lookup(key, port))
            except socket.gaierror as error:
                if error.errno in _NO_SUCH_NAME:
                    return None
                continue
            except UnicodeError:  # not a name the resolver can encode: no retry makes it one
                return None
            except OSError:  # timeouts included (socket.timeout is an OSError)
                continue
            return found or None
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _unique(found: Sequence[Tuple[int, str]]) -> Tuple[Tuple[int, str], ...]:
    return tuple(dict.fromkeys((family, ip) for family, ip in found))


_SHARED_LOCK = threading.Lock()
_SHARED = {}


def shared_resolver(settings: DnsSettings = DnsSettings()) -> CachingResolver:
    """The process's resolver over the system's for ``settings``: one cache for every fetch of the worker."""
    with _SHARED_LOCK:
        if settings not in _SHARED:
            _SHARED[settings] = CachingResolver(system_resolver, settings)
        return _SHARED[settings]
