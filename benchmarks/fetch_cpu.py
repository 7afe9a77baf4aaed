"""CPU per request of the download client (``pipeline.download.fetch``) as a worker runs it, on loopback.

    python -m benchmarks.fetch_cpu [--requests 3000] [--hosts 8] [--threads 32] [--repeats 3] [--names]
        [--per-host 0] [--per-host-rate 0]

The fetch path alone, without Beam: a thread pool of ``--threads`` calls
``fetch`` through the ``DownloadWorker`` that the download DoFn's instances
share (TLS context, host limiter, DNS cache). Its CPU is this process's
(every thread; ``benchmarks.harness.Timer``); the server runs in its own process
(one port per host, the download benchmark's pictures served from memory)
and is not counted. The per-host bounds are off by default, as in
``download_vs_img2dataset``: a loopback server answers faster than any
polite rate, so a binding rate would measure waiting, not work. Bounds that
do not bind (``--per-host 8 --per-host-rate 100000`` with 8 hosts and 32
threads) measure the limiter's own bookkeeping.

``--names`` asks for ``host<k>.test:<port>`` instead of ``127.0.0.1:<port>``,
through a lookup that answers 127.0.0.1 at once: the resolver's own cost
(cache, bookkeeping) is then in the figure; without it the URL holds a
literal address and nothing is looked up.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
from concurrent.futures import ThreadPoolExecutor

from benchmarks import harness, record
from benchmarks.helpers import loopback
from benchmarks.helpers.images import make_images


def worker_client(per_host: int, per_host_rate: float, lookup):
    """``fetch_one(url)`` with the state one worker's threads share."""
    from pipeline.download.fetch import FetchOptions
    from pipeline.download.politeness import HostPolicy
    from pipeline.download.resolver import DnsSettings
    from pipeline.download.worker import DownloadWorker

    hosts = HostPolicy(concurrency=per_host, rate=per_host_rate)
    return DownloadWorker(FetchOptions(allow_loopback=True), hosts, DnsSettings(), lookup).fetch


def instant_lookup(host, port):
    return [(socket.AF_INET, "127.0.0.1")]


def one_pass(urls, args) -> dict:
    threads = args.threads
    fetch_one = worker_client(args.per_host, args.per_host_rate, instant_lookup)
    with harness.Timer() as timer, ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(fetch_one, urls))
    cpu, wall = timer.cpu_s, timer.wall_s
    ok = sum(1 for r in results if r.ok)
    if ok != len(urls):
        reasons = sorted({r.reason for r in results if not r.ok})
        raise SystemExit(f"{len(urls) - ok} of {len(urls)} requests failed: {reasons}")
    return {"requests": len(urls), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "cpu_ms_per_request": round(1000 * cpu / len(urls), 3), "requests_per_s": round(len(urls) / wall, 1)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--hosts", type=int, default=8, help="server ports, one per host")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--images", type=int, default=200, help="distinct pictures served (cyclically)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--names", action="store_true", help="host names through the resolver, not literal IPs")
    parser.add_argument("--per-host", type=int, default=0, help="requests in flight per host (0: no bound)")
    parser.add_argument("--per-host-rate", type=float, default=0.0, help="requests per second per host (0: no bound)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)

    run = record.Run()
    images = make_images(args.images)
    server, ports = loopback.start(images, args.hosts, cycle=True)
    host = (lambda k: f"host{k}.test") if args.names else (lambda k: "127.0.0.1")
    urls = [f"http://{host(i % args.hosts)}:{ports[i % args.hosts]}/{i}.jpg" for i in range(args.requests)]
    passes = []
    try:
        one_pass(urls[: min(200, len(urls))], args)  # warm-up: imports, first connections
        for _ in range(args.repeats):
            server_cpu = harness.process_cpu_seconds(server.pid)
            figures = one_pass(urls, args)
            figures["server_cpu_s"] = round(harness.process_cpu_seconds(server.pid) - server_cpu, 2)
            figures["load"] = record.load()
            passes.append(figures)
            print(json.dumps(figures), flush=True)
    finally:
        server.terminate()
    summary = {
        "requests": args.requests, "hosts": args.hosts, "threads": args.threads, "names": args.names,
        "per_host": args.per_host, "per_host_rate": args.per_host_rate,
        "mean_image_bytes": round(sum(map(len, images)) / len(images)),
        "cpu_ms_per_request_median": statistics.median(p["cpu_ms_per_request"] for p in passes),
        "requests_per_s_median": statistics.median(p["requests_per_s"] for p in passes),
    }
    print(json.dumps(summary, indent=1))
    run.write("fetch_cpu", {"summary": summary, "passes": passes}, args.json)


if __name__ == "__main__":
    main()
