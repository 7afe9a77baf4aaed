"""What one worker process shares among its fetching threads: TLS context, DNS cache, host limiter.

The per-host bounds and the DNS cache only mean something per process: Beam
may run several instances of a DoFn in one worker process (one per harness
thread), and each would otherwise bound its own share of a host and ask
the resolver its own questions. ``shared_worker`` hands every caller in the
process with the same settings the same ``DownloadWorker``.
"""

from __future__ import annotations

import threading
from typing import Optional

from pipeline.download.addresses import Resolver, system_resolver
from pipeline.download.fetch import Fetched, FetchOptions, fetch, tls_context
from pipeline.download.politeness import HostLimiter, HostPolicy
from pipeline.download.resolver import CachingResolver, DnsSettings


class DownloadWorker:
    """``fetch(url)`` with the state a worker's threads share; thread-safe."""

    def __init__(self, options: FetchOptions = FetchOptions(), hosts: HostPolicy = HostPolicy(),
                 dns: DnsSettings = DnsSettings(), lookup: Resolver = system_resolver):
        self.options = options
        self.context = tls_context()  # loads the CA store: once per process
        self.resolver = CachingResolver(lookup, dns)
        self.limiter = HostLimiter(hosts)

    def fetch(self, url: str, parts: int = 1) -> Fetched:
        """``url`` routed as one of ``parts`` sub-keys of its host (``politeness.routing_key``)."""
        return fetch(url, self.options, resolver=self.resolver, limiter=self.limiter, context=self.context,
                     parts=parts)


_LOCK = threading.Lock()
_WORKERS = {}


def shared_worker(options: FetchOptions, hosts: HostPolicy, dns: DnsSettings,
                  lookup: Optional[Resolver] = None) -> DownloadWorker:
    """The process's ``DownloadWorker`` for these settings (``lookup``: a test's resolver, None: the system's)."""
    key = (options, hosts, dns, lookup)
    with _LOCK:
        if key not in _WORKERS:
            _WORKERS[key] = DownloadWorker(options, hosts, dns, lookup or system_resolver)
        return _WORKERS[key]
