"""The worker's DNS (``pipeline.download.resolver``): cache, retries, the attempt's deadline, the address policy.

Lookups are injected (``HostFarm.lookup`` or a test's own), so failures and
slow answers are made on purpose; the fetches go to real loopback servers.
"""

import socket
import threading
import time

import pytest

from pipeline.download.fetch import FetchOptions, fetch
from pipeline.download.resolver import CachingResolver, DnsFailure, DnsSettings
from tests.pipeline.download_server import HostFarm

OPTIONS = FetchOptions(connect_timeout=1, read_timeout=1, deadline=3, retries=0, allow_loopback=True)
LOOPBACK = [(socket.AF_INET, "127.0.0.1")]


class Counting:
    """A lookup that answers from a script (answers, or exceptions to raise), counting the queries."""

    def __init__(self, *script, delay=0.0):
        self.script, self.delay, self.asked = list(script), delay, []
        self.lock = threading.Lock()

    def __call__(self, host, port):
        with self.lock:
            self.asked.append(host)
            step = self.script[min(len(self.asked), len(self.script)) - 1]
        time.sleep(self.delay)
        if isinstance(step, BaseException):
            raise step
        return step


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def again():
    return socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


def no_such_name():
    return socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_an_answer_is_reused_for_its_ttl():
    lookup, clock = Counting(LOOPBACK), FakeClock()
    resolver = CachingResolver(lookup, DnsSettings(ttl=300), clock=clock)
    assert all(resolver.resolve("Images.test", 80) == LOOPBACK for _ in range(5))
    assert resolver.resolve("images.test", 443) == LOOPBACK  # one name, whatever the case or port
    assert lookup.asked == ["images.test"] and resolver.hits == 5
    clock.now += 301
    resolver.resolve("images.test", 80)
    assert len(lookup.asked) == 2


def test_a_name_that_does_not_exist_is_asked_once_per_negative_ttl():
    lookup, clock = Counting(no_such_name()), FakeClock()
    resolver = CachingResolver(lookup, DnsSettings(negative_ttl=60, retries=2), clock=clock)
    for _ in range(4):
        with pytest.raises(DnsFailure, match="dns_error"):
            resolver.resolve("gone.test", 80)
    assert len(lookup.asked) == 1  # an answer: not retried, and remembered
    clock.now += 61
    with pytest.raises(DnsFailure):
        resolver.resolve("gone.test", 80)
    assert len(lookup.asked) == 2


def test_temporary_failures_are_retried_with_backoff():
    lookup, waits = Counting(again(), socket.timeout("timed out"), LOOPBACK), []
    resolver = CachingResolver(lookup, DnsSettings(retries=2, backoff=0.5), sleep=waits.append)
    assert resolver.resolve("flaky.test", 80) == LOOPBACK
    assert len(lookup.asked) == 3 and waits == [0.5, 1.0]


def test_a_failure_that_outlasts_its_retries_is_a_dns_error_and_is_remembered():
    lookup = Counting(again())
    resolver = CachingResolver(lookup, DnsSettings(retries=2, backoff=0.01))
    for _ in range(3):
        with pytest.raises(DnsFailure, match="dns_error"):
            resolver.resolve("down.test", 80)
    assert len(lookup.asked) == 3  # 1 + 2 retries, then the failure is cached


def test_threads_asking_for_one_name_share_one_query():
    lookup = Counting(LOOPBACK, delay=0.3)
    resolver = CachingResolver(lookup)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(resolver.resolve("busy.test", 80))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [LOOPBACK] * 8 and lookup.asked == ["busy.test"]


def test_a_slow_lookup_ends_at_the_callers_deadline_and_its_answer_is_kept():
    release = threading.Event()
    lookup = Counting(LOOPBACK)
    resolver = CachingResolver(lambda host, port: (release.wait(10), lookup(host, port))[1])
    start = time.monotonic()
    with pytest.raises(DnsFailure, match="dns_timeout"):
        resolver.resolve("slow.test", 80, deadline=time.monotonic() + 0.3)
    assert time.monotonic() - start < 2.0
    release.set()
    for _ in range(100):  # the lookup finishes on its own thread
        if len(resolver):
            break
        time.sleep(0.02)
    assert resolver.resolve("slow.test", 80, deadline=time.monotonic()) == LOOPBACK  # from the cache
    assert lookup.asked == ["slow.test"]


def test_a_queued_lookup_nobody_waits_for_is_dropped():
    release = threading.Event()
    asked = []

    def blocking(host, port):
        asked.append(host)
        release.wait(10)
        return LOOPBACK

    resolver = CachingResolver(blocking, DnsSettings(threads=1))
    threading.Thread(target=resolver.resolve, args=("first.test", 80), daemon=True).start()
    time.sleep(0.1)
    with pytest.raises(DnsFailure, match="dns_timeout"):
        resolver.resolve("second.test", 80, deadline=time.monotonic() + 0.2)  # queued behind the first
    release.set()
    time.sleep(0.2)
    assert asked == ["first.test"]
    assert resolver.resolve("second.test", 80, deadline=time.monotonic() + 2) == LOOPBACK  # asked anew
    assert asked == ["first.test", "second.test"]


def test_the_cache_is_bounded_least_recently_used_first():
    lookup = Counting(LOOPBACK)
    resolver = CachingResolver(lookup, DnsSettings(max_entries=3))
    for name in ("a.test", "b.test", "c.test", "a.test", "d.test", "e.test"):
        resolver.resolve(name, 80)
    assert len(resolver) == 3
    resolver.resolve("a.test", 80)  # used recently: kept
    resolver.resolve("b.test", 80)  # evicted: asked again
    assert lookup.asked == ["a.test", "b.test", "c.test", "d.test", "e.test", "b.test"]


# --- through fetch, on loopback -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def farm():
    with HostFarm(2) as running:
        yield running


def test_a_hosts_urls_and_redirect_hops_resolve_it_once(farm):
    lookup = Counting(LOOPBACK)
    resolver = CachingResolver(lookup)
    got = [fetch(farm.url(0, f"/img/good.jpg?n={i}"), OPTIONS, resolver=resolver) for i in range(10)]
    got.append(fetch(farm.url(0, "/redirect/3"), OPTIONS, resolver=resolver))
    assert all(r.ok for r in got) and got[-1].redirects == 3
    assert lookup.asked == ["host0.test"]


def test_dns_failures_injected_through_the_resolver_are_retried(farm):
    lookup = Counting(again(), again(), LOOPBACK)
    resolver = CachingResolver(lookup, DnsSettings(retries=2, backoff=0.05))
    got = fetch(farm.url(1, "/img/good.jpg"), OPTIONS, resolver=resolver)
    assert got.ok and len(lookup.asked) == 3
    gone = fetch("http://gone.test/x.jpg", OPTIONS, resolver=CachingResolver(Counting(no_such_name())))
    assert gone.reason == "dns_error"


def test_the_lookup_counts_in_the_attempts_deadline(farm):
    """A 4 s lookup under a 1 s deadline ends the attempt at about 1 s, not after the lookup."""
    options = FetchOptions(connect_timeout=1, read_timeout=1, deadline=1, retries=0, allow_loopback=True)
    resolver = CachingResolver(Counting(LOOPBACK, delay=4.0))
    start = time.monotonic()
    got = fetch(farm.url(0, "/img/good.jpg"), options, resolver=resolver)
    assert got.reason == "dns_timeout" and time.monotonic() - start < 2.5


def test_a_cached_private_answer_is_refused_every_time_and_never_connected(farm):
    asked = []

    def lookup(host, port):
        asked.append(host)
        return [(socket.AF_INET, "10.0.0.5")] if host == "intranet.test" else LOOPBACK

    resolver = CachingResolver(lookup)
    before = sum(len(server.arrivals) for server in farm.servers)
    port = farm.servers[0].port
    for _ in range(3):
        assert fetch(f"http://intranet.test:{port}/img/good.jpg", OPTIONS, resolver=resolver).reason == \
            "forbidden_address"
    redirected = fetch(farm.url(0, f"/redirect-to?url=http://intranet.test:{port}/x"), OPTIONS, resolver=resolver)
    assert redirected.reason == "forbidden_address" and redirected.redirects == 1
    assert asked.count("intranet.test") == 1
    assert sum(len(server.arrivals) for server in farm.servers) == before + 1  # the redirecting request only


def test_the_plain_call_form_raises_oserror_for_code_that_takes_a_lookup_function():
    resolver = CachingResolver(Counting(no_such_name()))
    with pytest.raises(OSError):
        resolver("gone.test", 80)
