"""``DownloadImages``: candidates without image bytes -> candidates with them, or ``download/<reason>``.

Runs between ``ReadCandidates`` and the record filters when the build is
given ``--download``; records that already carry bytes pass untouched, the
others are spread over the workers (a ``Reshuffle`` of URL rows) and fetched. The
fetching is ``pipeline.download.fetch`` (every limit and the address policy
live there); this module is the Beam side: a DoFn that keeps up to
``threads`` requests in flight per worker on a thread pool, never more than
``in_flight`` elements buffered, and hands on each result in the window of
its own element.

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
  the ``download`` namespace ``fetched``, ``bytes``, ``retries``, ``redirects``.
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
from pipeline.download import staging
from pipeline.download.fetch import FetchOptions, Fetched, HostSlots, fetch, tls_context
from pipeline.readers.rows import Rejection
from pipeline.stats import METRICS_NAMESPACE

SURVIVORS, REJECTED = "survivors", "rejected"
DOWNLOAD_NAMESPACE = "download"
#: What a download adds to a record's carried columns (written as ``source_<name>``).
CARRIED = ("http_status", "final_url")


@dataclasses.dataclass(frozen=True)
class DownloadOptions:
    """The stage's settings: per-request limits (``fetch``) and per-worker concurrency."""

    fetch: FetchOptions = FetchOptions()
    threads: int = 32                   # requests in flight per worker
    per_host: int = 8                   # of those, to one host (0: no limit)

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
        self.resolver = resolver  # None: the system resolver (tests inject one)
        self.fetched = Metrics.counter(DOWNLOAD_NAMESPACE, "fetched")
        self.bytes = Metrics.counter(DOWNLOAD_NAMESPACE, "bytes")
        self.retries = Metrics.counter(DOWNLOAD_NAMESPACE, "retries")
        self.redirects = Metrics.counter(DOWNLOAD_NAMESPACE, "redirects")

    def setup(self):
        self.pool = ThreadPoolExecutor(self.options.threads, thread_name_prefix="download")
        self.slots = HostSlots(self.options.per_host)
        self.context = tls_context()
        self.pending = set()

    def start_bundle(self):
        self.pending = set()
        self.staging = staging.StagingWriter(self.staging_dir)

    def _submit(self, candidate: Candidate, window, timestamp):
        kwargs = {"slots": self.slots, "context": self.context}
        if self.resolver is not None:
            kwargs["resolver"] = self.resolver
        future = self.pool.submit(fetch, candidate.url, self.options.fetch, **kwargs)
        future.element = (candidate, window, timestamp)
        self.pending.add(future)

    def _results(self, futures):
        for future in futures:
            candidate, window, timestamp = future.element
            fetched = future.result()  # fetch() returns a reason for anything the network does
            self.retries.inc(fetched.attempts - 1)
            self.redirects.inc(fetched.redirects)
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
        self.notes = {"download": (
            f"{options.threads} requests in flight per worker, {options.per_host or 'no limit'} per host; "
            f"deadline {options.fetch.deadline:g}s, max {options.fetch.max_bytes:,} bytes, "
            f"{options.fetch.retries} retries, {options.fetch.max_redirects} redirects{loopback}"
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
    # (flag, type, FetchOptions/DownloadOptions field, help)
    ("threads", int, "threads", "requests in flight per worker"),
    ("per_host", int, "per_host", "of those, at most this many to one host (0: no limit)"),
    ("connect_timeout", float, "connect_timeout", "seconds to connect"),
    ("read_timeout", float, "read_timeout", "seconds any single read may wait"),
    ("deadline", float, "deadline", "seconds for one attempt in all (connect, headers, body, redirects)"),
    ("max_bytes", int, "max_bytes", "largest body accepted, checked while it streams"),
    ("retries", int, "retries", "extra attempts after HTTP 429/5xx (Retry-After honoured)"),
    ("max_redirects", int, "max_redirects", "redirects followed, each to an allowed address"),
)


def add_arguments(parser) -> None:
    """The ``--download*`` flags (defaults from ``DownloadOptions``/``FetchOptions``)."""
    defaults = {**dataclasses.asdict(FetchOptions()), "threads": DownloadOptions.threads, "per_host": DownloadOptions.per_host}
    parser.add_argument(
        "--download", action="store_true",
        help="fetch the images of URL-only rows (TSV/JSONL/Parquet without image bytes) inside the job; "
             "failures are download/<reason> in the funnel. Loopback, link-local, private, multicast and "
             "reserved addresses are refused",
    )
    for name, kind, field, text in _FLAGS:
        flag = name.replace("_", "-")
        parser.add_argument(f"--download-{flag}", f"--download_{name}", dest=f"download_{name}", type=kind,
                            default=defaults[field], help=f"{text} (default {defaults[field]})")
    parser.add_argument("--download-user-agent", "--download_user_agent", dest="download_user_agent",
                        default=FetchOptions.user_agent, help="User-Agent header; its first word is our X-Robots-Tag agent name")
    parser.add_argument("--download-allow-loopback", "--download_allow_loopback", dest="download_allow_loopback",
                        action="store_true", help="also fetch from 127.0.0.0/8 and ::1: for tests and benchmarks only")


def from_args(args) -> DownloadOptions:
    """``DownloadOptions`` from parsed flags; ``ValueError`` names a flag out of range."""
    values = {name: getattr(args, f"download_{name}") for name, _, _, _ in _FLAGS}
    for name, value in values.items():
        if name in ("connect_timeout", "read_timeout", "deadline"):
            bad, need = not value > 0, "> 0"
        else:
            lowest = 1 if name in ("threads", "max_bytes") else 0
            bad, need = value < lowest, f">= {lowest}"
        if bad:
            raise ValueError(f"--download-{name.replace('_', '-')} {value}: must be {need}")
    fetch_fields = {k: v for k, v in values.items() if k not in ("threads", "per_host")}
    return DownloadOptions(
        fetch=FetchOptions(**fetch_fields, user_agent=args.download_user_agent,
                           allow_loopback=bool(args.download_allow_loopback)),
        threads=values["threads"], per_host=values["per_host"],
    )
