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
  resolved once per hop (through the worker's DNS cache, ``resolver``, inside
  the attempt's deadline), every address is checked (``addresses``), and the
  socket connects to the checked address itself: there is no second
  resolution for a DNS-rebinding answer to slip into. Every redirect hop is
  checked the same way. Proxies from the environment are never used.
- **Opt-outs.** ``X-Robots-Tag`` directives (``noai``, ``noimageai``, ... for
  every agent or for ours), as img2dataset honours them.
- **Politeness.** Every request and redirect hop waits for its host in the
  worker's ``politeness.HostLimiter`` (requests in flight and per second,
  pauses after 429/503); that wait is not counted in the deadline. Bounded
  retries on 429/5xx with exponential backoff, honouring ``Retry-After`` (a
  longer wait than ``max_retry_wait`` gives up at once rather than
  sleeping). A User-Agent that names us first (the ``X-Robots-Tag`` agent)
  and can carry a contact for site owners.

Reasons are stable words for the funnel (``download/<reason>``): ``bad_url``,
``scheme_not_allowed``, ``dns_error``, ``dns_timeout``, ``forbidden_address``,
``host_backed_off``, ``connection_error``, ``tls_error``, ``timeout``,
``protocol_error``, ``http_<status>``, ``too_many_redirects``, ``opted_out``,
``not_an_image``, ``too_large``, ``incomplete_body``, ``empty_body``,
``client_error``.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import ipaddress
import logging
import math
import re
import socket
import ssl
import threading
import time
from typing import Callable, Optional, Tuple, Union
from urllib.parse import quote, urljoin, urlsplit

from pipeline.download.addresses import Resolver, refusal
from pipeline.download.politeness import HostLimiter, HostPaused, HostPolicy, sub_key
from pipeline.download.resolver import CachingResolver, DnsFailure, shared_resolver

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
    contact: str = ""                   # a URL or an e-mail address for site owners, sent in the User-Agent
    disallowed_directives: Tuple[str, ...] = DISALLOWED_DIRECTIVES
    allow_loopback: bool = False        # tests and benchmarks against a local server only

    def agent_token(self) -> str:
        """Our name in ``X-Robots-Tag: <agent>: noai``: the User-Agent's first product name."""
        return self.user_agent.split("/", 1)[0].split()[0].strip().lower() if self.user_agent.strip() else ""

    @property
    def user_agent_header(self) -> str:
        """``user_agent (+contact)``, as crawlers name their info page (an e-mail as a ``mailto:`` URL)."""
        if not self.contact:
            return self.user_agent
        contact = self.contact if _URL_CONTACT.fullmatch(self.contact) else "mailto:" + self.contact
        return f"{self.user_agent} (+{contact})"


#: A contact the User-Agent can carry as is: no spaces, quotes, parentheses or ";" (they would end its comment).
_URL_CONTACT = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[!#-'*-:=?-~]*)?")
_EMAIL_CONTACT = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")


def check_user_agent(user_agent: str, contact: str = "") -> None:
    """``ValueError`` naming what is wrong with a User-Agent and contact before any request sends them."""
    if not user_agent.strip() or not all(" " <= c <= "~" for c in user_agent):
        raise ValueError(f"user agent {user_agent!r}: must be printable ASCII, starting with our agent name")
    if contact and not (_URL_CONTACT.fullmatch(contact) or _EMAIL_CONTACT.fullmatch(contact)):
        raise ValueError(f"contact {contact!r}: must be an http(s) URL or an e-mail address")


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
    waited: float = 0.0                 # seconds spent waiting for the host's turn (politeness)

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


_SHARED_CONTEXT = []
_SHARED_CONTEXT_LOCK = threading.Lock()


def _shared_tls_context() -> ssl.SSLContext:
    """The process's context, made once, by the first thread that needs it (it loads the CA store)."""
    with _SHARED_CONTEXT_LOCK:
        if not _SHARED_CONTEXT:
            _SHARED_CONTEXT.append(tls_context())
        return _SHARED_CONTEXT[0]


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


def _addresses(host: str, port: int, resolver, deadline: float, allow_loopback: bool):
    """The allowed addresses of ``host`` (a literal IP is its own address); ``_Failed`` if none."""
    try:
        literal = ipaddress.ip_address(host)
        found = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
    except ValueError:
        try:
            if isinstance(resolver, CachingResolver):
                found = resolver.resolve(host, port, deadline)
            else:
                found = list(resolver(host, port))
        except DnsFailure as failure:
            raise _Failed(failure.reason) from None
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
                context = context if context is not None else _shared_tls_context()
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


class _Hop:
    """What one request saw, for the host limiter (set as soon as the response's head arrives)."""

    __slots__ = ("status", "retry_after")

    def __init__(self):
        self.status, self.retry_after = 0, None


def _exchange(hop: _Hop, url, scheme, host, port, target, addresses, deadline, options, context):
    """One request: ``(redirect URL, None)`` or ``(None, body)``; ``_Failed`` for any refusal."""
    connection = _open(scheme, host, port, addresses, deadline, options, context)
    try:
        connection.putrequest("GET", target, skip_accept_encoding=True)
        connection.putheader("User-Agent", options.user_agent_header)
        connection.putheader("Accept", "image/*,*/*;q=0.8")
        connection.putheader("Accept-Encoding", "identity")
        connection.putheader("Connection", "close")
        connection.endheaders()
        response = connection.getresponse()
        status = hop.status = response.status
        location = response.getheader("Location")
        if status in REDIRECT_STATUSES and location:
            return urljoin(url, location.strip()), None
        if status != 200:
            hop.retry_after = retry_after_seconds(response.getheader("Retry-After"))
            raise _Failed(f"http_{status}", status)
        if options.disallowed_directives and is_opted_out(
            response.headers.get_all("X-Robots-Tag") or [], options.agent_token(), options.disallowed_directives
        ):
            raise _Failed("opted_out", status)
        if not is_image_type(response.getheader("Content-Type")):
            raise _Failed("not_an_image", status)
        return None, _read_body(response, options)
    finally:
        connection.close()


def limiter_key(scheme: str, host: str, port: int) -> str:
    """The host's key in the limiter: its name, with the port unless it is the scheme's own."""
    return host if port == (443 if scheme == "https" else 80) else f"{host}:{port}"


def _attempt(url: str, options: FetchOptions, resolver, limiter: HostLimiter, context, parts: int) -> Fetched:
    """One attempt: the request and its redirects, under one deadline.

    The deadline covers the name lookups; the waits for a host's turn are
    added to it: waiting for a busy host is not the server's slowness.
    """
    deadline = time.monotonic() + options.deadline
    redirects, status, waited = 0, 0, 0.0
    first_host, sub = None, sub_key(url, parts)
    while True:
        hop = _Hop()
        try:
            scheme, host, port, target = _target(url)
            addresses = _addresses(host, port, resolver, deadline, options.allow_loopback)
            key = limiter_key(scheme, host, port)
            first_host = first_host or key
            # The URL's own host is limited as the sub-key the build routed it by; other hosts as themselves.
            key, share = (f"{key}#{sub}", parts) if parts > 1 and key == first_host else (key, 1)
            wait = limiter.acquire(key, options.max_retry_wait, share)
            waited += wait
            deadline += wait
            try:
                location, body = _exchange(hop, url, scheme, host, port, target, addresses, deadline, options, context)
            finally:
                limiter.release(key, hop.status, hop.retry_after)
            status = hop.status
            if location is None:
                return Fetched(url, url, status, body, redirects=redirects, waited=waited)
            if redirects >= options.max_redirects:
                raise _Failed("too_many_redirects", status)
            redirects += 1
            url = location
        except (_Failed, HostPaused, OSError, http.client.HTTPException, ValueError, UnicodeError) as error:
            return Fetched(url, url, getattr(error, "status", 0) or hop.status or status, None, _reason_of(error),
                           redirects=redirects, retry_after=hop.retry_after, waited=waited)


def _reason_of(error: Exception) -> str:
    """The funnel's word for what ended an attempt (most specific class first)."""
    if isinstance(error, _Failed):
        return error.reason
    if isinstance(error, HostPaused):
        return "host_backed_off"
    if isinstance(error, socket.timeout):
        return "timeout"
    if isinstance(error, ssl.SSLError):  # certificate errors included (ssl.SSLCertVerificationError)
        return "tls_error"
    if isinstance(error, http.client.IncompleteRead):
        return "incomplete_body"
    if isinstance(error, http.client.InvalidURL):
        return "bad_url"
    if isinstance(error, (http.client.HTTPException, ValueError, UnicodeError)):  # malformed status line, headers
        return "protocol_error"
    return "connection_error"  # reset, refused, unreachable


def fetch(
    url: str,
    options: FetchOptions = FetchOptions(),
    resolver: Union[CachingResolver, Resolver, None] = None,
    limiter: Optional[HostLimiter] = None,
    context: Optional[ssl.SSLContext] = None,
    sleep: Callable[[float], None] = time.sleep,
    parts: int = 1,
) -> Fetched:
    """Download ``url`` under ``options``; never raises for anything the network or server does.

    ``resolver``: the worker's ``CachingResolver`` (None: the process's, over
    the system resolver), or a plain ``(host, port) -> addresses`` function
    called once per hop. ``limiter``: the worker's ``HostLimiter`` (None: no
    bound but this URL's own pauses). ``context``: None is the process's,
    made on the first ``https`` URL. ``parts``: the build routed this URL
    as one of that many sub-keys of its host (``politeness.routing_key``).

    An unexpected error of this client itself is ``client_error`` (traceback
    in the log), so one odd URL cannot fail a job of millions.
    """
    resolver = resolver if resolver is not None else shared_resolver()
    limiter = limiter if limiter is not None else HostLimiter(HostPolicy(0, 0, backoff=options.backoff))
    retry, waited = 0, 0.0
    while True:
        try:
            fetched = _attempt(url, options, resolver, limiter, context, parts)
        except Exception:  # noqa: BLE001 (a bug here must cost one URL, not the job)
            logging.getLogger(__name__).exception("download client error on %r", url)
            return Fetched(url, url, 0, None, "client_error", attempts=retry + 1, waited=waited)
        waited += fetched.waited
        wait = retry_wait(fetched, retry, options)
        if wait is None:
            return dataclasses.replace(fetched, url=url, attempts=retry + 1, waited=waited)
        sleep(wait)
        retry += 1
