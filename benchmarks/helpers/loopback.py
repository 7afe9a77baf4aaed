"""An image server on 127.0.0.1 in a process of its own, for the download benchmarks: JPEGs served from memory.

``/<i>.jpg`` answers picture ``i`` (with ``cycle``, picture ``i`` modulo
their count; otherwise 404 past the end). The server's CPU is not the
client's: read it apart with ``benchmarks.harness.process_cpu_seconds``.
"""

from __future__ import annotations

import http.server
import multiprocessing
import threading
from typing import List, Tuple


class _Handler(http.server.BaseHTTPRequestHandler):
    images: list = []
    cycle = False

    def do_GET(self):  # noqa: N802
        try:
            index = int(self.path.strip("/").split(".")[0])
            body = self.images[index % len(self.images) if self.cycle else index]
        except (ValueError, IndexError):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(images, hosts: int, cycle: bool, ready) -> None:
    _Handler.images, _Handler.cycle = images, cycle
    http.server.ThreadingHTTPServer.request_queue_size = 1024
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler) for _ in range(hosts)]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ready.put([server.server_address[1] for server in servers])
    threading.Event().wait()


def start(images: List[bytes], hosts: int = 1, cycle: bool = False) -> Tuple[multiprocessing.Process, List[int]]:
    """The server process (``terminate()`` it when done) and its ports, one per host."""
    context = multiprocessing.get_context("fork")
    ready = context.Queue()
    server = context.Process(target=_serve, args=(images, hosts, cycle, ready), daemon=True)
    server.start()
    return server, ready.get(timeout=30)
