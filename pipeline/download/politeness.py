"""How hard a worker may press one host: requests in flight, requests per second, pauses after 429/503.

``HostLimiter`` is shared by a worker's fetching threads. Before each
request (and each redirect hop) ``acquire(key)`` waits until the host has a
free slot (``concurrency``), its next start time has come (``rate``: one
request per ``1 / rate`` seconds, no bursts) and it is not paused;
``release(key, status, retry_after)`` hands the slot back and, on 429 or
503, pauses the host: for the server's ``Retry-After`` when it sends one
(as long as it asks: that is the point of it), else ``backoff``,
``2 * backoff``, ... up to ``max_backoff`` per consecutive 429/503; any
other answer ends the streak. A pause stops every request to the host, not
only the retry of the URL that was refused. A request whose host is paused
for longer than it may wait (``max_wait``: ``FetchOptions.max_retry_wait``)
is not sent at all (``HostPaused``: ``download/host_backed_off``).

A host's state is dropped once it has been idle ``idle`` seconds (not
paused, nothing in flight or waiting), and the least recently used idle
hosts go first when more than ``max_hosts`` are known: memory stays bounded
on a list of millions of hosts.

The bounds hold per limiter, so per worker process. Across workers they
hold when every URL of a key goes through one limiter at a time: the build
routes URLs by ``routing_key`` (the host, or one of ``parts`` sub-keys of a
very large host), and a sub-key is limited with ``policy.divided(parts)``
so that the host's sub-keys together stay within its bound.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import threading
import time
from typing import Callable, Optional
from urllib.parse import urlsplit

#: Statuses after which the whole host waits.
PAUSE_STATUSES = frozenset({429, 503})


@dataclasses.dataclass(frozen=True)
class HostPolicy:
    """The bounds on one host (or one sub-key of it); times in seconds."""

    concurrency: int = 8          # requests in flight (0: no bound)
    rate: float = 10.0            # requests started per second (0: no bound)
    backoff: float = 1.0          # first pause after 429/503 without Retry-After; doubles per repeat
    max_backoff: float = 300.0    # longest such pause (a server's Retry-After is honoured as sent)
    idle: float = 60.0            # a host unused this long is forgotten
    max_hosts: int = 100_000      # hosts remembered at most (idle ones evicted first)

    @property
    def max_parts(self) -> int:
        """The most sub-keys a host may be split into with every bound still exact."""
        return self.concurrency if self.concurrency > 0 else 1 << 30

    def divided(self, parts: int) -> "HostPolicy":
        """The bounds of one of ``parts`` sub-keys: their sum is this policy's (``parts <= max_parts``)."""
        if not 1 <= parts <= self.max_parts:
            raise ValueError(f"a host can be split into 1 to {self.max_parts} sub-keys, not {parts}")
        return dataclasses.replace(self, concurrency=self.concurrency // parts, rate=self.rate / parts)


class HostPaused(Exception):
    """The host asked us to wait longer than this request may wait."""

    def __init__(self, seconds: float):
        super().__init__(f"host paused for {seconds:.1f}s")
        self.seconds = seconds


class _Host:
    __slots__ = ("in_flight", "waiting", "next_start", "paused_until", "strikes", "last_used", "ready")

    def __init__(self, now: float):
        self.in_flight = self.waiting = self.strikes = 0
        self.next_start = self.paused_until = -math.inf
        self.last_used = now
        self.ready = None  # a Condition, made when a thread first has to wait (~1 kB each)


class HostLimiter:
    """Per-host concurrency, rate and pauses for the threads of one worker (see the module's docstring)."""

    def __init__(self, policy: HostPolicy = HostPolicy(), clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.clock = clock
        self._lock = threading.Lock()
        self._hosts: "collections.OrderedDict[str, _Host]" = collections.OrderedDict()
        self._swept = clock()

    def __len__(self) -> int:
        return len(self._hosts)

    def acquire(self, key: str, max_wait: float = math.inf, parts: int = 1) -> float:
        """Wait for a slot of ``key``; returns the seconds waited. ``HostPaused`` if paused beyond ``max_wait``.

        ``parts``: ``key`` is one of that many sub-keys of its host, bounded by ``policy.divided(parts)``.
        """
        policy = self.policy if parts == 1 else self.policy.divided(parts)
        concurrency = policy.concurrency
        interval = 1.0 / policy.rate if policy.rate > 0 else 0.0
        with self._lock:
            start = now = self.clock()
            host = self._host(key, now)
            host.waiting += 1
            try:
                while True:
                    if host.paused_until - now > max_wait:
                        raise HostPaused(host.paused_until - now)
                    free = not concurrency or host.in_flight < concurrency
                    ready_at = max(host.next_start, host.paused_until)
                    if free and now >= ready_at:
                        break
                    # Without a free slot, a release wakes us; otherwise the start time does.
                    if host.ready is None:
                        host.ready = threading.Condition(self._lock)
                    host.ready.wait(None if not free else ready_at - now)
                    now = self.clock()
                host.in_flight += 1
                host.next_start = now + interval
                host.last_used = now
            finally:
                host.waiting -= 1
        return now - start

    def release(self, key: str, status: int = 0, retry_after: Optional[float] = None) -> float:
        """Hand back a slot of ``key`` after a response of ``status`` (0: none); returns the pause it set."""
        with self._lock:
            now = self.clock()
            host = self._hosts[key]  # never evicted while a slot is held
            host.in_flight -= 1
            host.last_used = now
            pause = 0.0
            if status in PAUSE_STATUSES:
                host.strikes += 1
                pause = retry_after if retry_after is not None else min(
                    self.policy.backoff * 2 ** (host.strikes - 1), self.policy.max_backoff)
                host.paused_until = max(host.paused_until, now + pause)
            elif status:
                host.strikes = 0
            if host.ready is not None:
                host.ready.notify_all()
            if now - self._swept > self.policy.idle / 4:
                self._sweep(now)
            return pause

    def _host(self, key: str, now: float) -> _Host:
        host = self._hosts.get(key)
        if host is None:
            if len(self._hosts) >= self.policy.max_hosts:
                self._sweep(now)
            host = self._hosts[key] = _Host(now)
        else:
            self._hosts.move_to_end(key)
        return host

    def _sweep(self, now: float) -> None:
        """Forget idle hosts, oldest first; over ``max_hosts``, also recently used or paused ones not in use."""
        self._swept = now
        over = len(self._hosts) - self.policy.max_hosts + 1
        idle_since = now - self.policy.idle
        gone = []
        for key, host in self._hosts.items():  # least recently used first
            crowded = len(gone) < over
            if host.last_used > idle_since and not crowded:
                break
            if host.in_flight or host.waiting or (host.paused_until > now and not crowded):
                continue
            gone.append(key)
        for key in gone:
            del self._hosts[key]


def host_key(url: str) -> str:
    """The politeness key of ``url``: its host name (lower case, IDNA), with the port if not the scheme's own.

    "" for a URL without a usable host (it fails before any request).
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        host = host.encode("idna").decode("ascii") if host else ""
    except (ValueError, UnicodeError):
        return ""
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return host if port is None or port == default else f"{host}:{port}"


def sub_key(url: str, parts: int) -> int:
    """A stable sub-key in ``[0, parts)`` for ``url`` (the same on every worker and every run)."""
    if parts <= 1:
        return 0
    digest = hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % parts


def routing_key(url: str, parts: int = 1) -> str:
    """``host`` or ``host#i``: the key a build groups a URL under so one limiter sees all of a key's requests."""
    host = host_key(url)
    return host if parts <= 1 else f"{host}#{sub_key(url, parts)}"
