"""Per-host bounds (``pipeline.download.politeness``) as a server standing in for many hosts sees them.

``HostFarm`` serves each host on its own loopback port and records when each
request arrived (``time.monotonic``, the client's clock). The client-side
spacing is exact; the server sees it blurred by how long each request took
to get there, so the rate checks allow ``JITTER_S`` of it: a client without
the bound sends a host's requests within a few milliseconds and fails them
by far.
"""

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.download.crawl import _Crawl
from pipeline.download.fetch import FetchOptions, fetch
from pipeline.download.politeness import HostLimiter, HostPaused, HostPolicy, host_key, routing_key, sub_key
from pipeline.download.resolver import CachingResolver
from pipeline.download.settings import DownloadOptions
from pipeline.download.worker import shared_worker
from tests.pipeline.download_server import HostFarm

OPTIONS = FetchOptions(connect_timeout=2, read_timeout=2, deadline=5, retries=0, backoff=0.05, max_retry_wait=5,
                       allow_loopback=True)
JITTER_S = 0.25


def most_in_window(arrivals, window: float) -> int:
    """The most arrivals inside any window of ``window`` seconds."""
    times, most, start = sorted(arrivals), 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        most = max(most, end - start + 1)
    return most


def crawl(urls, threads, fetch_one):
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fetch_one, urls))


def test_each_hosts_request_rate_stays_under_the_bound():
    rate, per_host = 10.0, 20
    with HostFarm(3) as farm:
        limiter, resolver = HostLimiter(HostPolicy(concurrency=8, rate=rate)), CachingResolver(farm.lookup)
        urls = [farm.url(h, "/img/good.jpg") for _ in range(per_host) for h in range(3)]
        got = crawl(urls, 12, lambda url: fetch(url, OPTIONS, resolver=resolver, limiter=limiter))
        assert all(r.ok for r in got)
        for server in farm.servers:
            assert len(server.arrivals) == per_host
            assert most_in_window(server.arrivals, 1.0) <= math.floor(rate * (1.0 + JITTER_S)) + 1
            assert max(server.arrivals) - min(server.arrivals) >= (per_host - 1) / rate - JITTER_S


def test_a_host_split_among_workers_stays_under_its_bound_in_all():
    """Phase two's routing in one process: each of ``parts`` sub-keys of one host has its own limiter (its own
    worker) with ``policy.divided(parts)``; the host sees their sum, within the host's bounds."""
    policy, parts, count = HostPolicy(concurrency=4, rate=12.0), 4, 24
    with HostFarm(1) as farm:
        urls = [farm.url(0, f"/img/good.jpg?n={i}") for i in range(count)]
        workers = [(HostLimiter(policy), CachingResolver(farm.lookup)) for _ in range(parts)]

        def work(part):
            limiter, resolver = workers[part]
            mine = [url for url in urls if sub_key(url, parts) == part]
            return crawl(mine, 3, lambda url: fetch(url, OPTIONS, resolver=resolver, limiter=limiter, parts=parts))

        got = [r for results in crawl(range(parts), parts, work) for r in results]
        assert len(got) == count and all(r.ok for r in got)
        # Each sub-key may start one request at once: the host's bound plus one per sub-key.
        assert most_in_window(farm.servers[0].arrivals, 1.0) <= math.floor(policy.rate * (1.0 + JITTER_S)) + parts


def test_retry_after_pauses_every_request_to_the_host():
    with HostFarm(2, throttle={0: (429, "1", 1)}) as farm:
        limiter, resolver = HostLimiter(HostPolicy(concurrency=8, rate=0)), CachingResolver(farm.lookup)
        first = fetch(farm.url(0, "/img/good.jpg"), OPTIONS, resolver=resolver, limiter=limiter)
        assert (first.reason, first.retry_after) == ("http_429", 1.0)
        other_host = fetch(farm.url(1, "/img/good.jpg"), OPTIONS, resolver=resolver, limiter=limiter)
        assert other_host.ok and other_host.waited < 0.5  # the pause is the refusing host's only
        urls = [farm.url(0, f"/img/good.jpg?n={i}") for i in range(5)]
        got = crawl(urls, 5, lambda url: fetch(url, OPTIONS, resolver=resolver, limiter=limiter))
        assert all(r.ok for r in got)
        refused_at, *later = farm.servers[0].arrivals
        assert len(later) == 5 and min(later) - refused_at >= 1.0 - JITTER_S


def test_503_without_retry_after_backs_the_host_off_exponentially_up_to_the_cap():
    policy = HostPolicy(concurrency=8, rate=0, backoff=0.2, max_backoff=0.4)
    with HostFarm(1, throttle={0: (503, None, 4)}) as farm:
        limiter, resolver = HostLimiter(policy), CachingResolver(farm.lookup)
        got = [fetch(farm.url(0, f"/img/good.jpg?n={i}"), OPTIONS, resolver=resolver, limiter=limiter)
               for i in range(5)]
        assert [r.reason for r in got] == ["http_503"] * 4 + [""]
        arrivals = farm.servers[0].arrivals
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        assert [round(g, 1) >= want for g, want in zip(gaps, [0.2, 0.4, 0.4, 0.4])] == [True] * 4
        assert gaps[3] < 1.2  # capped: uncapped, the fourth pause would be 1.6 s


def test_a_host_paused_longer_than_a_request_may_wait_is_not_requested():
    with HostFarm(2, throttle={0: (429, "3600", 1)}) as farm:
        limiter, resolver = HostLimiter(HostPolicy(concurrency=8, rate=0)), CachingResolver(farm.lookup)
        got = crawl([farm.url(0, f"/img/good.jpg?n={i}") for i in range(6)], 1,
                    lambda url: fetch(url, OPTIONS, resolver=resolver, limiter=limiter))
        assert [r.reason for r in got] == ["http_429"] + ["host_backed_off"] * 5
        assert len(farm.servers[0].arrivals) == 1
        assert fetch(farm.url(1, "/img/good.jpg"), OPTIONS, resolver=resolver, limiter=limiter).ok


def test_the_download_dofns_of_one_process_share_one_limiter():
    """Two DoFn instances of one worker process, one host: the bound is the process's, not each instance's."""
    rate, count = 8.0, 16
    with HostFarm(1) as farm:
        options = DownloadOptions(OPTIONS, threads=4, hosts=HostPolicy(concurrency=8, rate=rate))
        instances = [_Crawl(options, "staging-unused", "build-unused", None, farm.lookup) for _ in range(2)]
        for instance in instances:
            instance.setup()
        try:
            assert instances[0].worker is instances[1].worker
            urls = [farm.url(0, f"/img/good.jpg?n={i}") for i in range(count)]
            halves = [urls[: count // 2], urls[count // 2:]]
            crawl(range(2), 2, lambda i: crawl(halves[i], 4, instances[i].worker.fetch))
        finally:
            for instance in instances:
                instance.teardown()
        arrivals = farm.servers[0].arrivals
        assert len(arrivals) == count
        assert most_in_window(arrivals, 1.0) <= math.floor(rate * (1.0 + JITTER_S)) + 1


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_pauses_grow_per_repeat_and_a_success_ends_the_streak():
    clock = FakeClock()
    limiter = HostLimiter(HostPolicy(concurrency=0, rate=0, backoff=1.0, max_backoff=3.0), clock=clock)
    pauses = []
    for status in (503, 429, 503, 503, 200, 503):
        limiter.acquire("a")
        pauses.append(limiter.release("a", status))
        clock.now += 10  # past every pause: the next acquire does not wait
    assert pauses == [1.0, 2.0, 3.0, 3.0, 0.0, 1.0]
    limiter.acquire("a")
    assert limiter.release("a", 429, retry_after=7.5) == 7.5  # the server's word, over the cap


def test_a_paused_host_refuses_requests_that_may_not_wait_that_long():
    clock = FakeClock()
    limiter = HostLimiter(HostPolicy(concurrency=0, rate=0), clock=clock)
    limiter.acquire("a")
    limiter.release("a", 429, retry_after=60)
    with pytest.raises(HostPaused):
        limiter.acquire("a", max_wait=30)
    clock.now += 31
    with pytest.raises(HostPaused):
        limiter.acquire("a", max_wait=28)
    clock.now += 30
    assert limiter.acquire("a", max_wait=0) == 0.0


def test_idle_hosts_are_forgotten_and_the_number_of_hosts_is_bounded():
    clock = FakeClock()
    limiter = HostLimiter(HostPolicy(concurrency=2, rate=0, idle=60, max_hosts=100), clock=clock)
    for i in range(100):
        limiter.acquire(f"h{i}")
        limiter.release(f"h{i}", 200)
    limiter.acquire("paused")
    limiter.release("paused", 429, retry_after=600)
    limiter.acquire("busy")  # held: never forgotten
    assert len(limiter) == 100  # at the cap: the oldest idle hosts made room
    clock.now += 61
    limiter.acquire("new")
    limiter.release("new", 200)
    assert sorted(key for key in limiter._hosts) == ["busy", "new", "paused"]  # the paused host keeps its pause
    with pytest.raises(HostPaused):
        limiter.acquire("paused", max_wait=30)
    limiter.release("busy")


def test_concurrency_waiters_are_woken_by_a_release():
    limiter = HostLimiter(HostPolicy(concurrency=1, rate=0))
    limiter.acquire("a")
    entered = threading.Event()

    def second():
        limiter.acquire("a")
        entered.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not entered.wait(0.2)
    limiter.release("a", 200)
    assert entered.wait(5)
    thread.join()


def test_routing_keys():
    assert host_key("https://Images.Example.ORG/a.jpg") == "images.example.org"
    assert host_key("http://example.org:80/a") == host_key("https://example.org:443/b") == "example.org"
    assert host_key("http://127.0.0.1:8080/a") == "127.0.0.1:8080"
    assert host_key("http://例え.jp/a") == "xn--r8jz45g.jp"
    assert host_key("not a url") == "" and host_key("http://[::1/") == ""
    urls = [f"https://cdn.example.org/{i}.jpg" for i in range(4000)]
    counts = [sum(1 for url in urls if sub_key(url, 8) == part) for part in range(8)]
    assert min(counts) > 400 and sum(counts) == 4000  # ~500 each
    assert sub_key(urls[7], 8) == sub_key(urls[7], 8) and sub_key(urls[7], 1) == 0
    assert routing_key(urls[7]) == "cdn.example.org"
    assert routing_key(urls[7], 8) == f"cdn.example.org#{sub_key(urls[7], 8)}"


def test_a_policy_divided_among_sub_keys_sums_to_the_hosts_bound():
    policy = HostPolicy(concurrency=8, rate=10.0)
    part = policy.divided(4)
    assert (part.concurrency, part.rate) == (2, 2.5)
    assert policy.divided(8).concurrency == 1 and policy.max_parts == 8
    with pytest.raises(ValueError, match="1 to 8"):
        policy.divided(9)  # a sub-key would get no slot at all
    assert HostPolicy(concurrency=0, rate=6.0).divided(3) == HostPolicy(concurrency=0, rate=2.0)


def test_shared_worker_is_one_per_process_and_settings():
    options = FetchOptions(allow_loopback=True)
    one = shared_worker(options, HostPolicy(), DownloadOptions().dns)
    assert shared_worker(options, HostPolicy(), DownloadOptions().dns) is one
    assert shared_worker(options, HostPolicy(rate=1.0), DownloadOptions().dns) is not one
