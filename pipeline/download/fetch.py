"""One URL -> its image bytes, or the short reason why not (the HTTP client of the download stage).

Plain standard library (``socket``, ``ssl``, ``http.client``), no Beam, so
every rule is tested directly against a loopback server. What it guards
against, and how:

- **Hangs.** A connect timeout, a read timeout on every ``recv``, and one
  deadline per attempt over the whole exchange (connect, TLS, headers,
  body, redirects): a server that drips one byte a second or never ends its
  body is cut off at the deadline, not after ``read_timeout`` per byte. The
  deadline is enforced by the socket itself (``_DeadlineSocket``), so it
  holds inside ``http.client``'s header parsing too.
- **Huge or short bodies.** ``Content-Length`` above ``max_bytes`` is refused
  before reading; otherwise the body is counted while it streams and dropped
  at ``max_bytes + 1`` (chunked or endless bodies included). A body that ends
  before its ``Content-Length`` is ``incomplete_body``, never an image.
- **Fetching from inside the network.** Only ``http``/``https``. The name is
  resolved once per hop, every address is checked (``addresses``), and the
  socket connects to the checked address itself: there is no second
  resolution for a DNS-rebinding answer to slip into. Every redirect hop is
  checked the same way. Proxies from the environment are never used.
- **Opt-outs.** ``X-Robots-Tag`` directives (``noai``, ``noimageai``, ... for
  every agent or for ours), as img2dataset honours them.
- **Politeness.** Bounded retries on 429/5xx with exponential backoff,
  honouring ``Retry-After`` (a longer wait than ``max_retry_wait`` gives up
  at once rather than sleeping), a per-host limit on concurrent requests
  (``HostSlots``) and a configurable User-Agent.

Reasons are stable words for the funnel (``download/<reason>``): ``bad_url``,
``scheme_not_allowed``, ``dns_error``, ``forbidden_address``,
``connection_error``, ``tls_error``, ``timeout``, ``protocol_error``,
``http_<status>``, ``too_many_redirects``, ``opted_out``, ``not_an_image``,
``too_large``, ``incomplete_body``, ``empty_body``, ``client_error``.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import ipaddress
import logging
import math
import socket
import ssl
import threading
import time
from typing import Callable, Optional, Tuple
from urllib.parse import quote, urljoin, urlsplit

from pipeline.download.addresses import Resolver, refusal, system_resolver

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Declared types that may hold an image (servers often send octet-stream for files).
IMAGE_TYPES_BESIDES_IMAGE = ("application/octet-stream", "binary/octet-stream")
#: img2dataset's default ``disallowed_header_directives``.
DISALLOWED_DIRECTIVES = ("noai", "noimageai", "noindex", "noimageindex")
CHUNK = 64 * 1024
#: Printable ASCII stays as written; spaces and non-ASCII characters in a path
#: are percent-encoded (UTF-8), as browsers send them.
_KEEP_IN_TARGET = "".join(chr(c) for c in range(0x21, 0x7F))


@dataclasses.dataclass(frozen=True)
class FetchOptions:
    """Limits of one download; every time in seconds."""

    connect_timeout: float = 5.0
    read_timeout: float = 10.0          # one recv
    deadline: float = 30.0              # one attempt, all hops, first byte sent to last byte read
    max_bytes: int = 20 * 1024 * 1024
    retries: int = 2                    # extra attempts after a 429/5xx
    backoff: float = 1.0                # first wait without Retry-After; doubles per retry
    max_retry_wait: float = 30.0        # a longer Retry-After: give up now
    max_redirects: int = 5
    user_agent: str = "alt-text-corpus/1.0"
    disallowed_directives: Tuple[str, ...] = DISALLOWED_DIRECTIVES
    allow_loopback: bool = False        # tests and benchmarks against a local server only

    def agent_token(self) -> str:
        """Our name in ``X-Robots-Tag: <agent>: noai``: the User-Agent's first product name."""
        return self.user_agent.split("/", 1)[0].split()[0].strip().lower() if self.user_agent.strip() else ""


@dataclasses.dataclass(frozen=True)
class Fetched:
    """What one URL gave: ``body`` on success, else ``reason``; the rest for the ledger."""

    url: str
    final_url: str = ""                 # after redirects ("" if no request was sent)
    status: int = 0                     # the last HTTP status seen (0: none)
    body: Optional[bytes] = None
    reason: str = ""                    # "" on success
    attempts: int = 0
    redirects: int = 0
    retry_after: Optional[float] = None  # of the last response, seconds

    @property
    def ok(self) -> bool:
        return not self.reason


class DeadlineExceeded(socket.timeout):
    """The attempt's deadline passed (a ``socket.timeout``, so ``http.client`` treats it as one)."""


class _Deadline:
    """Arms the socket before every read: timeout = min(read timeout, time left); none left -> timeout."""

    deadline = math.inf
    read_timeout: Optional[float] = None

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("download deadline exceeded")
        self.settimeout(left if self.read_timeout is None else min(self.read_timeout, left))

    def recv(self, *args, **kwargs):
        self._arm()
        return super().recv(*args, **kwargs)

    def recv_into(self, *args, **kwargs):
        self._arm()
        return super().recv_into(*args, **kwargs)


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    pass


def tls_context() -> ssl.SSLContext:
    """Certificate and host name checked (``create_default_context``); one per worker, it loads the CA store."""
    context = ssl.create_default_context()
    context.sslsocket_class = _DeadlineSSLSocket
    return context


class HostSlots:
    """At most ``limit`` requests in flight per host (0: no limit); shared by a worker's threads."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._slots = {}

    def slot(self, host: str):
        if self.limit <= 0:
            return _NO_SLOT
        with self._lock:
            if host not in self._slots:
                self._slots[host] = threading.BoundedSemaphore(self.limit)
            return self._slots[host]


class _NoSlot:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_SLOT = _NoSlot()


class _Failed(Exception):
    """A hop ended in a reason (carries the status seen, if any)."""

    def __init__(self, reason: str, status: int = 0):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def retry_after_seconds(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """``Retry-After`` as seconds to wait: delta-seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_wait(fetched: Fetched, retry: int, options: FetchOptions) -> Optional[float]:
    """How long to wait before retry number ``retry`` (0-based), or None to give up now."""
    if fetched.status not in RETRY_STATUSES or retry >= options.retries:
        return None
    wait = fetched.retry_after if fetched.retry_after is not None else options.backoff * (2 ** retry)
    return wait if wait <= options.max_retry_wait else None


def is_opted_out(header_values, agent_token: str, disallowed) -> bool:
    """``X-Robots-Tag`` values: ``"noai, noimageai"`` (every agent) or ``"<agent>: noai"`` (one agent)."""
    disallowed = {d.lower() for d in disallowed}
    for value in header_values:
        agent, sep, directives = value.partition(":")
        if not sep:
            agent, directives = "", value
        agent = agent.strip().lower()
        if agent and agent != agent_token:
            continue
        if any(d.strip().lower() in disallowed for d in directives.split(",")):
            return True
    return False


def is_image_type(content_type: Optional[str]) -> bool:
    """A missing type is allowed (the image filters judge the bytes); a declared non-image is not."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind.startswith("image/") or kind in IMAGE_TYPES_BESIDES_IMAGE


def _target(url: str):
    """``(scheme, ascii host, port, request target, Host-header host)`` or ``_Failed``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _Failed("bad_url") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _Failed("scheme_not_allowed")
    host = parts.hostname
    if not host:
        raise _Failed("bad_url")
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise _Failed("bad_url") from None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    target = quote(target, safe=_KEEP_IN_TARGET)
    return scheme, host, port or (443 if scheme == "https" else 80), target


def _addresses(host: str, port: int, resolver: Resolver, allow_loopback: bool):
    """The allowed addresses of ``host`` (a literal IP is its own address); ``_Failed`` if none."""
    try:
        literal = ipaddress.ip_address(host)
        found = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
    except ValueError:
        try:
            found = list(resolver(host, port))
        except (OSError, UnicodeError):
            raise _Failed("dns_error") from None
    if not found:
        raise _Failed("dns_error")
    allowed = [(family, ip) for family, ip in found if refusal(ip, allow_loopback) is None]
    if not allowed:
        raise _Failed("forbidden_address")
    return allowed


def _connect(family: int, ip: str, port: int, deadline: float, options: FetchOptions):
    sock = _DeadlineSocket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(0.001, min(options.connect_timeout, deadline - time.monotonic())))
        sock.connect((ip, port) if family == socket.AF_INET else (ip, port, 0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def _open(scheme, host, port, addresses, deadline, options, context):
    """A connection to the first reachable allowed address (TLS checked against ``host``)."""
    error = None
    for family, ip in addresses:
        try:
            sock = _connect(family, ip, port, deadline, options)
        except OSError as caught:  # socket.timeout included
            error = caught
            continue
        try:
            if scheme == "https":
                sock = context.wrap_socket(sock, server_hostname=host)
                connection = http.client.HTTPSConnection(host, port, context=context)
            else:
                connection = http.client.HTTPConnection(host, port)
        except BaseException:
            sock.close()
            raise
        sock.deadline, sock.read_timeout = deadline, options.read_timeout
        connection.sock = sock  # http.client never connects (or resolves) on its own
        return connection
    if isinstance(error, socket.timeout):
        raise error
    raise _Failed("connection_error")


def _read_body(response, options: FetchOptions) -> bytes:
    length = response.getheader("Content-Length")
    if length and length.strip().isdigit() and int(length) > options.max_bytes:
        raise _Failed("too_large", response.status)
    chunks, total = [], 0
    while True:
        chunk = response.read(CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > options.max_bytes:
            raise _Failed("too_large", response.status)
        chunks.append(chunk)
    # http.client ends a read at a closed connection without saying the declared length was not reached.
    if response.length:
        raise _Failed("incomplete_body", response.status)
    if not total:
        raise _Failed("empty_body", response.status)
    return b"".join(chunks)


def _attempt(url: str, options: FetchOptions, resolver: Resolver, slots: HostSlots, context) -> Fetched:
    """One attempt: the request and its redirects, under one deadline.

    The deadline starts once the first host slot is held: waiting for a busy
    host is not the server's slowness.
    """
    deadline = None
    redirects, status = 0, 0
    while True:
        connection = None
        try:
            scheme, host, port, target = _target(url)
            addresses = _addresses(host, port, resolver, options.allow_loopback)
            with slots.slot(host):
                if deadline is None:
                    deadline = time.monotonic() + options.deadline
                connection = _open(scheme, host, port, addresses, deadline, options, context)
                connection.putrequest("GET", target, skip_accept_encoding=True)
                connection.putheader("User-Agent", options.user_agent)
                connection.putheader("Accept", "image/*,*/*;q=0.8")
                connection.putheader("Accept-Encoding", "identity")
                connection.putheader("Connection", "close")
                connection.endheaders()
                response = connection.getresponse()
                status = response.status
                location = response.getheader("Location")
                if status in REDIRECT_STATUSES and location:
                    if redirects >= options.max_redirects:
                        raise _Failed("too_many_redirects", status)
                    redirects += 1
                    url = urljoin(url, location.strip())
                    continue
                if status != 200:
                    after = retry_after_seconds(response.getheader("Retry-After"))
                    return Fetched(url, url, status, None, f"http_{status}", redirects=redirects, retry_after=after)
                if options.disallowed_directives and is_opted_out(
                    response.headers.get_all("X-Robots-Tag") or [], options.agent_token(), options.disallowed_directives
                ):
                    raise _Failed("opted_out", status)
                if not is_image_type(response.getheader("Content-Type")):
                    raise _Failed("not_an_image", status)
                body = _read_body(response, options)
                return Fetched(url, url, status, body, redirects=redirects)
        except _Failed as failed:
            return Fetched(url, url, failed.status or status, None, failed.reason, redirects=redirects)
        except socket.timeout:
            return Fetched(url, url, status, None, "timeout", redirects=redirects)
        except ssl.SSLError:  # certificate errors included (ssl.SSLCertVerificationError)
            return Fetched(url, url, status, None, "tls_error", redirects=redirects)
        except http.client.IncompleteRead:
            return Fetched(url, url, status, None, "incomplete_body", redirects=redirects)
        except http.client.InvalidURL:
            return Fetched(url, url, status, None, "bad_url", redirects=redirects)
        except (http.client.HTTPException, ValueError, UnicodeError):  # malformed status line, headers, chunks
            return Fetched(url, url, status, None, "protocol_error", redirects=redirects)
        except OSError:  # reset, refused, unreachable
            return Fetched(url, url, status, None, "connection_error", redirects=redirects)
        finally:
            if connection is not None:
                connection.close()


def fetch(
    url: str,
    options: FetchOptions = FetchOptions(),
    resolver: Resolver = system_resolver,
    slots: Optional[HostSlots] = None,
    context: Optional[ssl.SSLContext] = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Fetched:
    """Download ``url`` under ``options``; never raises for anything the network or server does.

    An unexpected error of this client itself is ``client_error`` (traceback
    in the log), so one odd URL cannot fail a job of millions.
    """
    slots = slots if slots is not None else HostSlots(0)
    context = context if context is not None else tls_context()
    retry = 0
    while True:
        try:
            fetched = _attempt(url, options, resolver, slots, context)
        except Exception:  # noqa: BLE001 (a bug here must cost one URL, not the job)
            logging.getLogger(__name__).exception("download client error on %r", url)
            return Fetched(url, url, 0, None, "client_error", attempts=retry + 1)
        wait = retry_wait(fetched, retry, options)
        if wait is None:
            return dataclasses.replace(fetched, url=url, attempts=retry + 1)
        sleep(wait)
        retry += 1
