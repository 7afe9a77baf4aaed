"""A loopback HTTP server that misbehaves on purpose, for the download stage's tests.

127.0.0.1 on an ephemeral port, one thread per request, started and stopped
by the test. Routes (every misbehaviour stops by itself after
``MAX_HANDLER_SECONDS``, so a client bug cannot leave a thread running):

- ``/img/<name>``: a real image from ``images`` (``image/jpeg`` or ``image/png``);
- ``/status/<code>``: that status, empty body;
- ``/flaky/<token>?fail=N&status=S&after=R``: status S (with ``Retry-After: R``
  if given) for the first N requests of the token, then ``/img/good.jpg``;
- ``/short?sent=N``: the good JPEG's ``Content-Length`` but only its first N
  bytes (default half), then the connection closes;
- ``/drip``: a declared 100 kB image sent one byte every ``DRIP_SECONDS``;
- ``/drip-headers``: the status line and headers one byte at a time;
- ``/stall``: accepts and says nothing;
- ``/endless``: no length, an unending stream of bytes as fast as it goes;
- ``/huge``: ``Content-Length`` of 10 GB; ``/huge-chunked``: a chunked body of
  ``HUGE_CHUNKED_BYTES``;
- ``/html``: a page (``text/html``); ``/mislabelled``: a JPEG sent as ``text/plain``;
- ``/redirect/<n>``: a chain of n redirects ending at ``/img/good.jpg``;
- ``/redirect-to?url=U``: one redirect to U (anywhere, relative or absolute);
- ``/optout?tag=V``: the good JPEG with ``X-Robots-Tag: V``;
- ``/slow-img``: the good JPEG after ``SLOW_IMAGE_SECONDS`` (``max_in_flight``
  records the most requests it served at once).

``hits`` counts requests per path, ``targets`` per request target (path and
query), ``hosts`` and ``agents`` record the Host and User-Agent headers, ``arrivals`` the time (``time.monotonic``, the
clients' clock) each request's head was read. ``throttle=(status,
retry_after, n)`` answers the first n requests, whatever their path, with
that status (and ``Retry-After`` unless None), as a host that is shedding
load does.

``HostFarm`` stands in for many hosts: one server (one port) per host, and
names ``host<k>.test`` that its ``lookup`` resolves to 127.0.0.1.
"""

from __future__ import annotations

import collections
import http.server
import socket
import threading
import time
from urllib.parse import parse_qs, urlsplit

from tests import images as made

DRIP_SECONDS = 0.05
MAX_HANDLER_SECONDS = 20.0
HUGE_CHUNKED_BYTES = 4 * 1024 * 1024
SLOW_IMAGE_SECONDS = 0.2


def jpeg(width: int, height: int, seed: int = 0, fmt: str = "JPEG") -> bytes:
    """A gradient image (real content, so decoders and hashes have work)."""
    return made.gradient(width, height, seed, fmt)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "misbehaving/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet console
        pass

    def _body(self, body: bytes, content_type: str = "image/jpeg", status: int = 200, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, pieces):
        """Write pieces until the client leaves or ``MAX_HANDLER_SECONDS`` pass."""
        stop = time.monotonic() + MAX_HANDLER_SECONDS
        for piece in pieces:
            if time.monotonic() > stop:
                return
            self.wfile.write(piece)
            self.wfile.flush()

    def do_GET(self):  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
        owner = self.server.owner
        with owner.lock:
            owner.arrivals.append(time.monotonic())
            owner.hits[path] += 1
            owner.targets[self.path] += 1
            owner.hosts.append(self.headers.get("Host", ""))
            owner.agents.append(self.headers.get("User-Agent", ""))
            count = owner.hits[path]
            throttled = len(owner.arrivals) <= owner.throttle[2]
        self.close_connection = True
        try:
            if throttled:
                status, after, _ = owner.throttle
                self._body(b"slow down", "text/plain", status, [("Retry-After", after)] if after is not None else [])
                return
            self._route(path, query, count, owner)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should on the misbehaving routes

    def _route(self, path, query, count, owner):
        good = owner.images["good.jpg"]
        if path.startswith("/img/") and path[5:] in owner.images:
            name = path[5:]
            self._body(owner.images[name], "image/png" if name.endswith(".png") else "image/jpeg")
        elif path.startswith("/status/"):
            self._body(b"", "text/plain", int(path.rsplit("/", 1)[1]))
        elif path.startswith("/flaky/"):
            if count <= int(query.get("fail", "1")):
                headers = [("Retry-After", query["after"])] if "after" in query else []
                self._body(b"busy", "text/plain", int(query.get("status", "503")), headers)
            else:
                self._body(good)
        elif path == "/short":
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(good)))
            self.end_headers()
            self.wfile.write(good[: int(query.get("sent", len(good) // 2))])
        elif path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(100_000))
            self.end_headers()
            self._stream(_dripping(b"\xff" * 100_000))
        elif path == "/drip-headers":
            self._stream(_dripping(b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\n" + b"X-Pad: x\r\n" * 10_000))
        elif path == "/stall":
            time.sleep(MAX_HANDLER_SECONDS)
        elif path == "/endless":
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.end_headers()
            self._stream(iter(lambda: b"\0" * 65536, None))
        elif path == "/huge":
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(10 * 1024**3))
            self.end_headers()
            self._stream(iter(lambda: b"\0" * 65536, None))
        elif path == "/huge-chunked":
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            piece = b"%x\r\n" % 65536 + b"\0" * 65536 + b"\r\n"
            self._stream([piece] * (HUGE_CHUNKED_BYTES // 65536) + [b"0\r\n\r\n"])
        elif path == "/html":
            self._body(b"<html><body>not an image</body></html>", "text/html; charset=utf-8")
        elif path == "/mislabelled":
            self._body(good, "text/plain")
        elif path.startswith("/redirect/"):
            left = int(path.rsplit("/", 1)[1])
            self._redirect(f"/redirect/{left - 1}" if left > 1 else "/img/good.jpg")
        elif path == "/redirect-to":
            self._redirect(query["url"])
        elif path == "/slow-img":
            with owner.lock:
                owner.in_flight += 1
                owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
            try:
                time.sleep(SLOW_IMAGE_SECONDS)
            finally:
                with owner.lock:
                    owner.in_flight -= 1
            self._body(good)
        elif path == "/optout":
            self._body(good, headers=[("X-Robots-Tag", query["tag"])])
        else:
            self._body(b"", "text/plain", 404)

    def _redirect(self, location: str):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()


def self_signed(directory, host: str):
    """A certificate for ``host`` (and its key) in ``directory``: ``(cert file, key file)``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / f"{host}.pem", directory / f"{host}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def _dripping(data: bytes):
    for i in range(len(data)):
        time.sleep(DRIP_SECONDS)
        yield data[i : i + 1]


class MisbehavingServer:
    """``with MisbehavingServer() as server: server.url("/drip")``."""

    def __init__(self, images=None, tls=None, throttle=(0, None, 0)):
        self.images = images or {"good.jpg": jpeg(320, 240)}
        self.tls = tls  # (certificate file, key file): serve HTTPS
        self.throttle = throttle
        self.hits = collections.Counter()
        self.targets = collections.Counter()
        self.hosts, self.agents, self.arrivals = [], [], []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    def __enter__(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.owner = self
        if self.tls:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{path}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class HostFarm:
    """``with HostFarm(3) as farm: farm.url(0, "/img/good.jpg")``: host k is ``host<k>.test`` on its own port.

    ``throttle`` maps a host number to its ``MisbehavingServer`` throttle.
    """

    def __init__(self, hosts: int, throttle=None, images=None):
        self.servers = [MisbehavingServer(images, throttle=(throttle or {}).get(k, (0, None, 0))) for k in range(hosts)]

    def __enter__(self):
        for server in self.servers:
            server.__enter__()
        return self

    def __exit__(self, *exc):
        for server in self.servers:
            server.__exit__(*exc)

    def url(self, host: int, path: str) -> str:
        return self.servers[host].url(path, host=f"host{host}.test")

    @staticmethod
    def lookup(host: str, port: int):
        """The farm's DNS: ``host<k>.test`` is 127.0.0.1, any other name does not exist."""
        if host.startswith("host") and host.endswith(".test"):
            return [(socket.AF_INET, "127.0.0.1")]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
