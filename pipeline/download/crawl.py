"""The crawl: distinct URLs routed by host, fetched politely, written to staging files, judged once.

    (url, needs) --RouteByHost--> ((host key, parts), [(url, needs), ...]) --_Crawl--> ImageFactsRow per URL

**Polite across the whole job.** The per-host bounds of ``politeness``
hold per ``HostLimiter``, that is per worker process. The crawl makes them
hold across workers by routing: every URL of a host is grouped under one
key, so one DoFn call, on one worker, fetches them all through that
process's limiter (``worker.shared_worker``). A host with more distinct
URLs than ``urls_per_key`` is split into ``parts = min(max_parts,
ceil(urls / urls_per_key))`` sub-keys (``politeness.routing_key``), each
limited to ``1 / parts`` of the host's bounds (``HostPolicy.divided``):
the sub-keys may run on different workers, and together stay within the
host's bounds. The count per host is a combine; only the hosts that are
split (at most ``urls / urls_per_key`` of them) reach the routing step, as
a side input. A sub-key's URLs are one list (URLs only, no bytes): at most
``urls_per_key``, or ``urls / max_parts`` for a host too large to split
further.

**One DoFn, many hosts at once.** A call hands its key's URLs to a queue
and returns; the DoFn submits URLs to its thread pool round-robin over the
keys it holds, never more at once per key than the key's share of
``--download_per_host``, so a thread never sits waiting for a busy host
while another host's URLs wait. Calls return at once unless more than
``MAX_QUEUED`` URLs are waiting.

**Staging.** Each body is written to the DoFn's staging file
(``staging.StagingWriter``), closed and indexed every ``staging_urls`` URLs
or ``staging_seconds``; failures are noted in the index with their reason.
Then the image is judged once (``image_facts.ImageJudge``), a batch at a
time. Nothing leaves the DoFn but the light facts.

Counters (namespace ``download``): ``fetched`` (URLs whose bytes came),
``failed`` (URLs whose download failed), ``bytes``, ``requests``
(attempts), ``retries``, ``redirects``, ``host_wait_ms`` (time spent
waiting for a host's turn) and ``staging_files``.
"""

from __future__ import annotations

import collections
import math
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Optional

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from filters import stages
from pipeline.download import staging
from pipeline.download.image_facts import ImageFactsRow, failed_facts, unjudged_facts
from pipeline.download.politeness import host_key, routing_key
from pipeline.download.settings import DownloadOptions
from pipeline.download.worker import shared_worker

NAMESPACE = "download"
#: URLs a DoFn instance may hold waiting before a call blocks (~100 bytes each).
MAX_QUEUED = 100_000
#: Fetched images judged together (the NSFW scorer and the embedder work on batches).
JUDGE_BATCH = 64


def parts_of(urls_of_host: int, urls_per_key: int, max_parts: int) -> int:
    """How many sub-keys a host with this many distinct URLs is routed as."""
    return max(1, min(max_parts, math.ceil(urls_of_host / urls_per_key)))


class RouteByHost(beam.PTransform):
    """``(url, needs)`` -> ``((routing key, parts), [(url, needs), ...])``, one group per host or sub-key."""

    def __init__(self, urls_per_key: int, max_parts: int):
        super().__init__()
        self.urls_per_key = urls_per_key
        self.max_parts = max_parts

    def expand(self, urls):
        per_key, max_parts = self.urls_per_key, self.max_parts
        split_hosts = (
            urls
            | "HostOfUrl" >> beam.Map(lambda item: (host_key(item[0]), 1))
            | "UrlsPerHost" >> beam.CombinePerKey(sum)
            | "HostsToSplit" >> beam.Filter(lambda kv: kv[1] > per_key)
            | "PartsOfHost" >> beam.Map(lambda kv: (kv[0], parts_of(kv[1], per_key, max_parts)))
        )

        def route(item, split):
            parts = split.get(host_key(item[0]), 1)
            return (routing_key(item[0], parts), parts), item

        return (
            urls
            | "RoutingKey" >> beam.Map(route, beam.pvalue.AsDict(split_hosts))
            | "UrlsPerRoutingKey" >> beam.GroupByKey()
        )


class _Key:
    """One routing key's URLs waiting in a DoFn, and how many of them are in flight."""

    __slots__ = ("name", "parts", "cap", "queue", "active", "in_line")

    def __init__(self, name: str, parts: int, cap: int):
        self.name, self.parts, self.cap = name, parts, cap
        self.queue = collections.deque()
        self.active = 0
        self.in_line = False  # in the DoFn's ``ready`` line

    @property
    def can_start(self) -> bool:
        return bool(self.queue) and self.active < self.cap


class _Crawl(beam.DoFn):
    """Routing groups -> an ``ImageFactsRow`` per URL (see the module's docstring)."""

    def __init__(self, options: DownloadOptions, staging_dir: str, build_id: str, image_judge=None, lookup=None):
        self.options = options
        self.staging_dir = staging_dir
        self.build_id = build_id
        self.image_judge = image_judge  # None: download only (facts without the image judged)
        self.lookup = lookup  # the uncached lookup under the worker's DNS cache; None: the system's (tests inject one)
        self.counters = {name: Metrics.counter(NAMESPACE, name) for name in (
            "fetched", "failed", "bytes", "requests", "retries", "redirects", "host_wait_ms", "staging_files")}

    def setup(self):
        self.pool = ThreadPoolExecutor(self.options.threads, thread_name_prefix="download")
        self.worker = shared_worker(self.options.fetch, self.options.hosts, self.options.dns, self.lookup)
        if self.image_judge is not None:
            self.image_judge.setup()

    def start_bundle(self):
        self.keys = {}                       # routing key -> _Key
        self.ready = collections.deque()     # keys with URLs waiting and a free slot
        self.pending = set()                 # futures of fetches in flight
        self.queued = 0
        self.to_judge = []
        self.writer = staging.StagingWriter(self.staging_dir, self.build_id, self.options.staging_urls,
                                            self.options.staging_seconds)

    def process(self, element):
        (name, parts), urls = element
        policy = self.options.hosts.divided(parts) if parts > 1 else self.options.hosts
        key = self.keys.get(name)
        if key is None:
            key = self.keys[name] = _Key(name, parts, policy.concurrency or self.options.threads)
        before = len(key.queue)
        key.queue.extend(urls)
        self.queued += len(key.queue) - before
        self._line_up(key)
        yield from self._collect(block=False)
        while self.queued > MAX_QUEUED:
            yield from self._collect(block=True)

    def finish_bundle(self):
        while self.pending or self.queued:
            for facts in self._collect(block=True):
                yield WindowedValue(facts, MIN_TIMESTAMP, (GlobalWindow(),))
        for facts in self._judge(flush=True):
            yield WindowedValue(facts, MIN_TIMESTAMP, (GlobalWindow(),))
        self._close_staging()

    def teardown(self):
        pool: Optional[ThreadPoolExecutor] = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _line_up(self, key: _Key) -> None:
        if key.can_start and not key.in_line:
            key.in_line = True
            self.ready.append(key)

    def _submit(self) -> None:
        """Fetches started round-robin over the keys: each key at most its cap in flight."""
        room = self.options.in_flight - len(self.pending)
        while room > 0 and self.ready:
            key = self.ready.popleft()
            key.in_line = False
            while key.can_start and room > 0:
                url, needs = key.queue.popleft()
                future = self.pool.submit(self.worker.fetch, url, key.parts)
                future.meta = (key, url, needs)
                self.pending.add(future)
                key.active += 1
                self.queued -= 1
                room -= 1
            if key.can_start:
                key.in_line = True
                self.ready.appendleft(key)  # out of room, not of slots: first in line next time
            elif not key.queue and not key.active:
                self.keys.pop(key.name, None)

    def _collect(self, block: bool):
        """Hands on the finished fetches (waiting for one if ``block``), refills the pool."""
        if self.pending:
            done, _ = wait(self.pending, timeout=None if block else 0, return_when=FIRST_COMPLETED)
            for future in done:
                self.pending.discard(future)
                key, url, needs = future.meta
                key.active -= 1
                self._line_up(key)
                if not key.queue and not key.active:
                    self.keys.pop(key.name, None)
                failed = self._staged(url, needs, future.result())  # fetch() turns every network failure into a reason
                if failed is not None:
                    yield failed
        self._submit()
        yield from self._judge(flush=not self.pending and not self.queued)
        if self.writer.due():
            self._close_staging()

    def _staged(self, url, needs, fetched) -> Optional[ImageFactsRow]:
        """Writes a body to the staging file (queued to be judged); a failure's facts at once."""
        counters = self.counters
        counters["requests"].inc(fetched.attempts)
        counters["retries"].inc(fetched.attempts - 1)
        counters["redirects"].inc(fetched.redirects)
        counters["host_wait_ms"].inc(int(1000 * fetched.waited))
        if not fetched.ok:
            counters["failed"].inc()
            self.writer.note(url, fetched.final_url, fetched.status, fetched.reason)
            return failed_facts(url, stages.reason("download", fetched.reason), fetched.status, fetched.final_url)
        counters["fetched"].inc()
        counters["bytes"].inc(len(fetched.body))
        source, ordinal, offset = self.writer.write(url, fetched.final_url, fetched.status, fetched.body)
        self.to_judge.append((url, fetched.body, needs, (fetched.status, fetched.final_url, source, ordinal, offset, True)))
        return None

    def _judge(self, flush: bool):
        if not self.to_judge or (len(self.to_judge) < JUDGE_BATCH and not flush):
            return []
        batch, self.to_judge = self.to_judge, []
        if self.image_judge is not None:
            return self.image_judge.judge(batch)
        return [unjudged_facts(url, where) for url, _, _, where in batch]

    def _close_staging(self) -> None:
        if self.writer.close():
            self.counters["staging_files"].inc()


class Crawl(beam.PTransform):
    """``(url, needs)``, one per distinct URL -> an ``ImageFactsRow`` per URL (see the module's docstring).

    ``image_judge``: ``image_facts.ImageJudge`` (None: the download alone,
    facts without the image judged). ``lookup``: a test's DNS lookup.
    """

    def __init__(self, options: DownloadOptions, staging_dir: str, build_id: str, image_judge=None, lookup=None):
        super().__init__()
        self.options = options
        self.staging_dir = staging_dir
        self.build_id = build_id
        self.image_judge = image_judge
        self.lookup = lookup

    def expand(self, urls):
        options = self.options
        return (
            urls
            | "RouteByHost" >> RouteByHost(options.urls_per_key, options.hosts.max_parts)
            | "Fetch" >> beam.ParDo(_Crawl(options, self.staging_dir, self.build_id, self.image_judge, self.lookup))
            .with_output_types(ImageFactsRow)
        )
