"""The crawl's settings (``DownloadOptions``) and their command-line flags (``pipeline.build --download*``).

Every flag is spelled with underscores (``--download_per_host_rate``), as
Beam's own; ``docs/downloading.md`` lists them with their defaults (a test
keeps the two in step).
"""

from __future__ import annotations

import dataclasses

from pipeline.download.fetch import FetchOptions, check_user_agent
from pipeline.download.politeness import HostPolicy
from pipeline.download.resolver import DnsSettings

#: What a download adds to a record's carried columns (written as ``source_<name>``).
CARRIED = ("http_status", "final_url")


@dataclasses.dataclass(frozen=True)
class DownloadOptions:
    """The crawl's settings: per-request limits (``fetch``), per-host bounds, DNS cache, routing, staging, resume."""

    fetch: FetchOptions = FetchOptions()
    threads: int = 32                   # requests in flight per worker process (DoFn instance)
    hosts: HostPolicy = HostPolicy()    # per host: in flight, per second, pauses after 429/503
    dns: DnsSettings = DnsSettings()
    urls_per_key: int = 5000            # a host with more distinct URLs is split into sub-keys (at most hosts.max_parts)
    staging_urls: int = 1000            # a staging file is closed and indexed after this many URLs ...
    staging_seconds: float = 60.0       # ... or this many seconds, whichever comes first
    refetch: bool = False               # fetch every URL again, whatever earlier builds' staging files hold
    keep: bool = False                  # keep the staging files once the build is committed

    @property
    def in_flight(self) -> int:
        return 2 * self.threads  # requests submitted per DoFn instance: keeps the pool busy, bounds memory


_FLAGS = (
    # (flag, type, where in DownloadOptions ("" itself, or fetch, hosts, dns), field, help)
    ("threads", int, "", "threads", "requests in flight per worker"),
    ("per_host", int, "hosts", "concurrency",
     "requests in flight to one host, across all workers (0: no limit; a split host shares it among its sub-keys)"),
    ("per_host_rate", float, "hosts", "rate", "requests started per second to one host, across all workers (0: no limit)"),
    ("max_host_backoff", float, "hosts", "max_backoff",
     "longest pause of a host after repeated 429/503 without Retry-After (a Retry-After is honoured as sent)"),
    ("urls_per_key", int, "", "urls_per_key",
     "a host with more distinct URLs is fetched by several workers, as at most --download_per_host sub-keys "
     "sharing its bounds"),
    ("connect_timeout", float, "fetch", "connect_timeout", "seconds to connect"),
    ("read_timeout", float, "fetch", "read_timeout", "seconds any single read may wait"),
    ("deadline", float, "fetch", "deadline", "seconds for one attempt in all (DNS, connect, headers, body, redirects)"),
    ("max_bytes", int, "fetch", "max_bytes", "largest body accepted, checked while it streams"),
    ("retries", int, "fetch", "retries", "extra attempts after HTTP 429/5xx (Retry-After honoured)"),
    ("max_redirects", int, "fetch", "max_redirects", "redirects followed, each to an allowed address"),
    ("dns_ttl", float, "dns", "ttl", "seconds a worker reuses a DNS answer (a failure: at most 60; 0: no cache)"),
    ("dns_retries", int, "dns", "retries", "more lookups after a temporary DNS failure, with backoff"),
    ("staging_urls", int, "", "staging_urls",
     "a staging file is closed and indexed after this many URLs (a killed build refetches at most that many per worker)"),
    ("staging_seconds", float, "", "staging_seconds", "... or after this many seconds"),
)
#: Flags whose value must be above 0 (the others: at least the lowest allowed).
_POSITIVE = ("connect_timeout", "read_timeout", "deadline", "staging_seconds")
_AT_LEAST_ONE = ("threads", "max_bytes", "urls_per_key", "staging_urls")


def _default(where: str, field: str):
    options = DownloadOptions()
    return getattr(getattr(options, where) if where else options, field)


def add_arguments(parser) -> None:
    """The ``--download*`` flags (defaults from ``DownloadOptions``)."""
    parser.add_argument(
        "--download", action="store_true",
        help="fetch the images of URL-only rows (TSV/JSONL/Parquet without image bytes) inside the job, each "
             "distinct URL once; failures are download/<reason> in the funnel. Loopback, link-local, private, "
             "multicast and reserved addresses are refused (docs/downloading.md)",
    )
    for name, kind, where, field, text in _FLAGS:
        default = _default(where, field)
        parser.add_argument(f"--download_{name}", dest=f"download_{name}", type=kind, default=default,
                            help=f"{text} (default {default})")
    parser.add_argument("--download_user_agent", dest="download_user_agent", default=FetchOptions.user_agent,
                        help="User-Agent header; its first word is our X-Robots-Tag agent name")
    parser.add_argument("--download_contact", dest="download_contact", default="",
                        help="a URL or e-mail address where site owners reach you, sent in the User-Agent "
                             "as 'agent (+URL)' (default none)")
    parser.add_argument("--download_refetch", dest="download_refetch", action="store_true",
                        help="fetch every URL again instead of reusing what earlier builds of this output "
                             "downloaded (OUTPUT/_downloads/)")
    parser.add_argument("--download_keep", dest="download_keep", action="store_true",
                        help="keep the downloads (OUTPUT/_downloads/) once the build is committed, for a later "
                             "build of the same list (default: deleted after the commit)")
    parser.add_argument("--download_allow_loopback", dest="download_allow_loopback", action="store_true",
                        help="also fetch from 127.0.0.0/8 and ::1: for tests and benchmarks only")


def from_args(args) -> DownloadOptions:
    """``DownloadOptions`` from parsed flags; ``ValueError`` names a flag out of range."""
    parts = {"": {}, "fetch": {}, "hosts": {}, "dns": {}}
    for name, _, where, field, _ in _FLAGS:
        value = getattr(args, f"download_{name}")
        if name in _POSITIVE:
            bad, need = not value > 0, "> 0"
        else:
            lowest = 1 if name in _AT_LEAST_ONE else 0
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
        refetch=bool(args.download_refetch), keep=bool(args.download_keep),
        **parts[""],
    )


def describe(options: DownloadOptions) -> str:
    """The funnel's note on the download stage: what bounded the crawl."""
    hosts, fetch = options.hosts, options.fetch
    loopback = " (loopback allowed: tests and benchmarks only)" if fetch.allow_loopback else ""
    return (
        f"each distinct URL fetched once; {options.threads} requests in flight per worker; per host, across "
        f"workers, {hosts.concurrency or 'no limit'} in flight and "
        f"{f'{hosts.rate:g}/s' if hosts.rate else 'no rate limit'}, paused after 429/503; deadline "
        f"{fetch.deadline:g}s, max {fetch.max_bytes:,} bytes, {fetch.retries} retries, {fetch.max_redirects} "
        f"redirects; User-Agent {fetch.user_agent_header!r}{loopback}"
    )
