"""A loopback HTTP server of images with known sizes and formats, 404s, a 500, a non-image and a slow reply.

For the img2dataset interop test: 127.0.0.1 only, an ephemeral port, stopped
by the test. Each case states what the build must do with the row, judged by
the image's *source* size whatever the downloader stored.
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import NamedTuple, Optional

from tests import images as made

SLOW_SECONDS = 4.0  # longer than the downloader's --timeout in the test


class Case(NamedTuple):
    path: str
    caption: str
    expected: str               # "written" or the first rejection reason
    size: Optional[tuple] = None  # (width, height) of the served image
    format: str = "JPEG"
    status: int = 200


CASES = (
    Case("/big.jpg", "a red barn in a wide green field", "written", (640, 480)),
    Case("/portrait.jpg", "a tall lighthouse on a rocky coast", "written", (300, 520)),
    Case("/drawing.png", "a blue kite above the sandy dunes", "written", (400, 300), "PNG"),
    Case("/shorter200.jpg", "a small stamp with a yellow bird", "image_size/too_small", (320, 200)),
    Case("/tiny.jpg", "an icon of a tiny green house", "image_size/too_small", (150, 150)),
    Case("/banner.jpg", "a long banner of mountain peaks at dusk", "image_aspect/too_elongated", (900, 250)),
    Case("/short_caption.jpg", "cat", "text_length/too_few_words", (500, 400)),
    Case("/missing.jpg", "a photo that is no longer there", "read/download_failed/http_404", status=404),
    Case("/broken.jpg", "a server that fails on this photo", "read/download_failed/http_500", status=500),
    Case("/page.jpg", "an html page served as an image", "read/download_failed/failed_to_resize", format="HTML"),
    Case("/slow.jpg", "a photo that takes too long to arrive", "read/download_failed/timeout", (400, 400)),
)


def image_bytes(case: Case) -> bytes:
    if case.format == "HTML":
        return b"<html><body>not an image</body></html>"
    return made.gradient(*case.size, fmt=case.format)  # the downloader's resize and re-encode have real content


class _Handler(http.server.BaseHTTPRequestHandler):
    bodies: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        case = next((c for c in CASES if c.path == self.path), None)
        if case is None or case.status != 200:
            self.send_response(case.status if case else 404)
            self.end_headers()
            return
        if case.path == "/slow.jpg":
            time.sleep(SLOW_SECONDS)
        body = self.bodies[case.path]
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if case.format == "HTML" else f"image/{case.format.lower()}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the downloader gave up (the slow case)

    def log_message(self, *args):  # quiet console
        pass


class LoopbackImages:
    """``with LoopbackImages() as server: server.url("/big.jpg")``."""

    def __enter__(self):
        _Handler.bodies = {c.path: image_bytes(c) for c in CASES if c.status == 200}
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def url(self, path: str) -> str:
        host, port = self.server.server_address
        return f"http://{host}:{port}{path}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
