"""``DownloadImages``: candidates without image bytes -> candidates with them, or ``download/<reason>``.

Runs between ``ReadCandidates`` and the record filters when the build is
given ``--download``; records that already carry bytes pass untouched, the
others are spread over the workers (a ``Reshuffle`` of URL rows) and fetched. The
fetching is ``pipeline.download.fetch`` (every limit and the address policy
live there) through the worker process's ``DownloadWorker`` (its DNS cache
and host limiter, shared by every DoFn instance of the process); this
module is the Beam side: a DoFn that keeps up to ``threads`` requests in
flight per instance on a thread pool, never more than ``in_flight`` elements
buffered, and hands on each result in the window of its own element.

What a download leaves behind:

- each fetched body is written once to a staging file of the build
  (``pipeline.download.staging``): the record handed on points there, and
  the build's second pass reads the bytes from it to write the shard;
- written records keep ``http_status`` and ``final_url`` as carried
  columns (the shards' ``source_http_status`` / ``source_final_url``); the
  source size is measured from the downloaded bytes by the image filters
  before anything is resized (the shards' ``original_width/height``);
- rejected ones get ``download/<reason>`` (``fetch``'s reasons) and the same
  two facts in the rejection ledger (``stats/rejected/*.jsonl``);
- Beam counters: ``funnel`` per rejection reason (as every stage), and in
  the ``download`` namespace ``fetched``, ``bytes``, ``retries``, ``redirects`` and
  ``host_wait_ms`` (time spent waiting for a host's turn).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Optional

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from common.schema import Candidate
from filters import stages
from filters.stages import REJECTED, SURVIVORS
from pipeline.download import staging
from pipeline.download.fetch import FetchOptions, Fetched, check_user_agent
from pipeline.download.politeness import HostPolicy
from pipeline.download.resolver import DnsSettings
from pipeline.download.worker import shared_worker
from pipeline.readers.rows import Rejection
from pipeline.stats import METRICS_NAMESPACE

DOWNLOAD_NAMESPACE = "download"
#: What a download adds to a record's carried columns (written as ``source_<name>``).
CARRIED = ("http_status", "final_url")


@dataclasses.dataclass(frozen=True)
class DownloadOptions:
    """The stage's settings: per-request limits (``fetch``), per-host bounds, DNS cache, concurrency."""

    fetch: FetchOptions = FetchOptions()
    threads: int = 32                   # requests in flight per worker
    hosts: HostPolicy = HostPolicy()    # per host: in flight, per second, pauses after 429/503
    dns: DnsSettings = DnsSettings()

    @property
    def in_flight(self) -> int:
        return 2 * self.threads  # elements buffered per bundle: keeps the pool busy, bounds memory


def downloaded(candidate: Candidate, fetched: Fetched, origin: tuple = ()):
    """The record after its download: with its image, or the ``download/<reason>`` rejection (pure).

    Both keep the last HTTP status (0: no response) and the final URL: the
    rejection in its ledger line, the record as carried text columns.
    ``origin`` is where the body was staged (``pipeline.download.staging``).
    """
    if not fetched.ok:
        reason = stages.reason("download", fetched.reason)
        detail = (("http_status", fetched.status), ("final_url", fetched.final_url))
        return Rejection(candidate.key, reason, candidate.url, candidate.alt_text, detail=detail)
    facts = (("http_status", str(fetched.status)), ("final_url", fetched.final_url))
    carried = tuple(kv for kv in candidate.carried if kv[0] not in CARRIED) + facts
    return candidate.replace(image=fetched.body, carried=carried, origin=origin)


class _Download(beam.DoFn):
    def __init__(self, options: DownloadOptions, staging_dir: str, resolver=None):
        self.options = options
        self.staging_dir = staging_dir
        self.resolver = resolver  # the uncached lookup under the worker's DNS cache; None: the system's (tests inject one)
        self.fetched = Metrics.counter(DOWNLOAD_NAMESPACE, "fetched")
        self.bytes = Metrics.counter(DOWNLOAD_NAMESPACE, "bytes")
        self.retries = Metrics.counter(DOWNLOAD_NAMESPACE, "retries")
        self.redirects = Metrics.counter(DOWNLOAD_NAMESPACE, "redirects")
        self.host_wait_ms = Metrics.counter(DOWNLOAD_NAMESPACE, "host_wait_ms")

    def setup(self):
        self.pool = ThreadPoolExecutor(self.options.threads, thread_name_prefix="download")
        self.worker = shared_worker(self.options.fetch, self.options.hosts, self.options.dns, self.resolver)
        self.pending = set()

    def start_bundle(self):
        self.pending = set()
        self.staging = staging.StagingWriter(self.staging_dir)

    def _submit(self, candidate: Candidate, window, timestamp):
        future = self.pool.submit(self.worker.fetch, candidate.url)
        future.element = (candidate, window, timestamp)
        self.pending.add(future)

    def _results(self, futures):
        for future in futures:
            candidate, window, timestamp = future.element
            fetched = future.result()  # fetch() returns a reason for anything the network does
            self.retries.inc(fetched.attempts - 1)
            self.redirects.inc(fetched.redirects)
            self.host_wait_ms.inc(int(1000 * fetched.waited))
            origin = ()
            if fetched.ok:
                origin = self.staging.write(candidate.url, fetched.final_url, fetched.status, fetched.body)
            result = downloaded(candidate, fetched, origin)
            value = WindowedValue(result, timestamp, (window,))
            if isinstance(result, Rejection):
                Metrics.counter(METRICS_NAMESPACE, result.reason).inc()
                yield beam.pvalue.TaggedOutput(REJECTED, value)
            else:
                self.fetched.inc()
                self.bytes.inc(len(result.image))
                yield value

    def process(self, candidate: Candidate, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        if candidate.image is not None:
            yield candidate
            return
        self._submit(candidate, window, timestamp)
        if len(self.pending) >= self.options.in_flight:
            done, self.pending = wait(self.pending, return_when=FIRST_COMPLETED)
            yield from self._results(done)

    def finish_bundle(self):
        pending, self.pending = self.pending, set()
        done, _ = wait(pending)
        yield from self._results(done)
        self.staging.close()

    def teardown(self):
        pool: Optional[ThreadPoolExecutor] = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class DownloadImages(beam.PTransform):
    """URL rows -> ``{"survivors": Candidate with image bytes and its staging origin, "rejected": Rejection}``.

    ``staging_dir``: where the fetched bodies are written (``pipeline.download.staging``).
    """

    decides = ("download",)

    def __init__(self, staging_dir: str, options: DownloadOptions = DownloadOptions(), resolver=None):
        super().__init__()
        self.staging_dir = staging_dir
        self.options = options
        self.resolver = resolver
        loopback = " (loopback allowed: tests and benchmarks only)" if options.fetch.allow_loopback else ""
        hosts = options.hosts
        self.notes = {"download": (
            f"{options.threads} requests in flight per worker; per host and worker "
            f"{hosts.concurrency or 'no limit'} in flight, {f'{hosts.rate:g}/s' if hosts.rate else 'no rate limit'}, "
            f"paused after 429/503; deadline {options.fetch.deadline:g}s, max {options.fetch.max_bytes:,} bytes, "
            f"{options.fetch.retries} retries, {options.fetch.max_redirects} redirects; "
            f"User-Agent {options.fetch.user_agent_header!r}{loopback}"
        )}

    def expand(self, url_rows):
        # URL rows are spread over the workers before fetching: one big URL list
        # is read by one worker, but must be fetched by all of them.
        outputs = (
            url_rows
            | "SpreadUrls" >> beam.Reshuffle()
            | "Fetch" >> beam.ParDo(_Download(self.options, self.staging_dir, self.resolver))
            .with_outputs(REJECTED, main=SURVIVORS)
        )
        return {SURVIVORS: outputs[SURVIVORS], REJECTED: outputs[REJECTED]}


# ---------------------------------------------------------------------------
# Command line (``pipeline.build``'s ``--download*`` flags)
# ---------------------------------------------------------------------------

_FLAGS = (
    # (flag, type, where in DownloadOptions ("" itself, or fetch, hosts, dns), field, help)
    ("threads", int, "", "threads", "requests in flight per worker"),
    ("per_host", int, "hosts", "concurrency", "of those, at most this many to one host at once (0: no limit)"),
    ("per_host_rate", float, "hosts", "rate", "requests started per second to one host, per worker (0: no limit)"),
    ("max_host_backoff", float, "hosts", "max_backoff",
     "longest pause of a host after repeated 429/503 without Retry-After (a Retry-After is honoured as sent)"),
    ("connect_timeout", float, "fetch", "connect_timeout", "seconds to connect"),
    ("read_timeout", float, "fetch", "read_timeout", "seconds any single read may wait"),
    ("deadline", float, "fetch", "deadline", "seconds for one attempt in all (DNS, connect, headers, body, redirects)"),
    ("max_bytes", int, "fetch", "max_bytes", "largest body accepted, checked while it streams"),
    ("retries", int, "fetch", "retries", "extra attempts after HTTP 429/5xx (Retry-After honoured)"),
    ("max_redirects", int, "fetch", "max_redirects", "redirects followed, each to an allowed address"),
    ("dns_ttl", float, "dns", "ttl", "seconds a worker reuses a DNS answer (a failure: at most 60; 0: no cache)"),
    ("dns_retries", int, "dns", "retries", "more lookups after a temporary DNS failure, with backoff"),
)


def _default(where: str, field: str):
    options = DownloadOptions()
    return getattr(getattr(options, where) if where else options, field)


def add_arguments(parser) -> None:
    """The ``--download*`` flags (defaults from ``DownloadOptions``)."""
    parser.add_argument(
        "--download", action="store_true",
        help="fetch the images of URL-only rows (TSV/JSONL/Parquet without image bytes) inside the job; "
             "failures are download/<reason> in the funnel. Loopback, link-local, private, multicast and "
             "reserved addresses are refused",
    )
    for name, kind, where, field, text in _FLAGS:
        default = _default(where, field)
        parser.add_argument(f"--download_{name}", type=kind, default=default, help=f"{text} (default {default})")
    parser.add_argument("--download_user_agent", default=FetchOptions.user_agent,
                        help="User-Agent header; its first word is our X-Robots-Tag agent name")
    parser.add_argument("--download_contact", default="",
                        help="a URL or e-mail address where site owners reach you, sent in the User-Agent "
                             "as 'agent (+URL)' (default none)")
    parser.add_argument("--download_allow_loopback", action="store_true",
                        help="also fetch from 127.0.0.0/8 and ::1: for tests and benchmarks only")


def from_args(args) -> DownloadOptions:
    """``DownloadOptions`` from parsed flags; ``ValueError`` names a flag out of range."""
    parts = {"": {}, "fetch": {}, "hosts": {}, "dns": {}}
    for name, _, where, field, _ in _FLAGS:
        value = getattr(args, f"download_{name}")
        if name in ("connect_timeout", "read_timeout", "deadline"):
            bad, need = not value > 0, "> 0"
        else:
            lowest = 1 if name in ("threads", "max_bytes") else 0
            bad, need = not value >= lowest, f">= {lowest}"
        if bad:
            raise ValueError(f"--download_{name} {value}: must be {need}")
        parts[where][field] = value
    user_agent, contact = args.download_user_agent, args.download_contact
    try:
        check_user_agent(user_agent)
    except ValueError as error:
        raise ValueError(f"--download_user_agent: {error}") from None
    try:
        check_user_agent(user_agent, contact)
    except ValueError as error:
        raise ValueError(f"--download_contact: {error}") from None
    dns = parts["dns"]
    return DownloadOptions(
        fetch=FetchOptions(**parts["fetch"], user_agent=user_agent, contact=contact,
                           allow_loopback=bool(args.download_allow_loopback)),
        hosts=HostPolicy(**parts["hosts"], backoff=FetchOptions.backoff),
        dns=DnsSettings(**dns, negative_ttl=min(DnsSettings.negative_ttl, dns["ttl"])),
        **parts[""],
    )
