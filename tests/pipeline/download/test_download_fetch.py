"""``pipeline.download.fetch`` against a real loopback server that misbehaves (``download_server``).

Every case is bounded by small timeouts (``OPTIONS``): a test that took
more than ``BOUND_S`` would mean the client hung, which is the bug.
"""

import dataclasses
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.download import addresses
from pipeline.download.fetch import (
    FetchOptions,
    _target,
    check_user_agent,
    fetch,
    is_image_type,
    is_opted_out,
    retry_after_seconds,
    tls_context,
)
from pipeline.download.politeness import HostLimiter, HostPolicy
from tests.pipeline.download_server import MisbehavingServer, jpeg, self_signed

OPTIONS = FetchOptions(
    connect_timeout=1.0, read_timeout=1.0, deadline=3.0, max_bytes=256 * 1024, retries=2, backoff=0.05,
    max_retry_wait=1.0, max_redirects=5, allow_loopback=True,
)
BOUND_S = 12.0  # far above OPTIONS.deadline: only a hang crosses it


def timed(url, options=OPTIONS, **kwargs):
    start = time.monotonic()
    result = fetch(url, options, **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < BOUND_S, f"{url} took {elapsed:.1f}s"
    return result


def test_good_image_arrives_whole(server):
    got = timed(server.url("/img/good.jpg"))
    assert got.ok and got.body == server.images["good.jpg"]
    assert (got.status, got.final_url, got.attempts, got.redirects) == (200, server.url("/img/good.jpg"), 1, 0)


@pytest.mark.parametrize("code", [404, 403, 410])
def test_client_errors_are_not_retried(server, code):
    got = timed(server.url(f"/status/{code}"))
    assert (got.reason, got.status, got.attempts, got.body) == (f"http_{code}", code, 1, None)


def test_server_error_is_retried_with_backoff_then_reported(server):
    waits = []
    got = timed(server.url("/status/500"), sleep=waits.append)
    assert (got.reason, got.status, got.attempts) == ("http_500", 500, 3)
    assert waits == [0.05, 0.1]  # exponential backoff, no Retry-After
    assert server.hits["/status/500"] == 3


def test_429_retry_after_is_honoured(server):
    waits = []
    got = timed(server.url("/flaky/a?fail=1&status=429&after=1"), sleep=waits.append)
    assert got.ok and got.attempts == 2 and waits == [1.0]
    assert got.body == server.images["good.jpg"]


def test_retry_after_longer_than_the_limit_gives_up_at_once(server):
    waits = []
    got = timed(server.url("/flaky/b?fail=5&status=429&after=3600"), sleep=waits.append)
    assert (got.reason, got.attempts, waits) == ("http_429", 1, [])


def test_503_twice_then_success_within_the_retry_budget(server):
    waits = []
    got = timed(server.url("/flaky/c?fail=2&status=503"), sleep=waits.append)
    assert got.ok and got.attempts == 3 and waits == [0.05, 0.1]


def test_retry_after_as_http_date():
    now = 1_700_000_000.0
    assert retry_after_seconds("Tue, 14 Nov 2023 22:13:40 GMT", now=now) == pytest.approx(20.0)
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


@pytest.mark.parametrize("path", ["/drip", "/drip-headers", "/stall"])
def test_dripping_or_silent_server_times_out_at_the_deadline(server, path):
    options = dataclasses.replace(OPTIONS, deadline=1.5)  # a drip runs to the deadline: half of OPTIONS' is enough
    start = time.monotonic()
    got = timed(server.url(path), options)
    assert got.reason == "timeout" and got.body is None
    assert time.monotonic() - start >= options.read_timeout  # it did wait, then gave up


def test_drip_is_cut_by_the_deadline_not_by_the_read_timeout(server):
    # Each byte arrives well within read_timeout: only the overall deadline can stop it.
    options = FetchOptions(connect_timeout=1, read_timeout=5.0, deadline=1.0, allow_loopback=True, max_bytes=1 << 21)
    start = time.monotonic()
    got = fetch(server.url("/drip"), options)
    assert got.reason == "timeout" and time.monotonic() - start < 4.5


@pytest.mark.parametrize("path", ["/endless", "/huge", "/huge-chunked"])
def test_bodies_over_the_size_cap_are_dropped(server, path):
    got = timed(server.url(path))
    assert (got.reason, got.status, got.body) == ("too_large", 200, None)


@pytest.mark.parametrize("sent", [0, 1000])
def test_a_body_shorter_than_its_content_length_is_incomplete(server, sent):
    got = timed(server.url(f"/short?sent={sent}"))
    assert (got.reason, got.status, got.body) == ("incomplete_body", 200, None)


def test_size_cap_is_exact(server):
    size = len(server.images["good.jpg"])
    assert fetch(server.url("/img/good.jpg"), FetchOptions(max_bytes=size, allow_loopback=True)).ok
    got = fetch(server.url("/img/good.jpg"), FetchOptions(max_bytes=size - 1, allow_loopback=True))
    assert got.reason == "too_large"


@pytest.mark.parametrize("path", ["/html", "/mislabelled"])
def test_declared_non_images_are_refused_before_the_body(server, path):
    assert timed(server.url(path)).reason == "not_an_image"


def test_content_types():
    assert is_image_type("image/webp") and is_image_type("IMAGE/JPEG; q=1") and is_image_type(None)
    assert is_image_type("application/octet-stream")
    assert not is_image_type("text/html; charset=utf-8") and not is_image_type("application/json")


def test_redirect_chain_is_followed_and_the_final_url_kept(server):
    got = timed(server.url("/redirect/3"))
    assert got.ok and got.redirects == 3 and got.final_url == server.url("/img/good.jpg")
    assert got.url == server.url("/redirect/3")


def test_redirects_beyond_the_limit(server):
    got = timed(server.url("/redirect/6"))
    assert (got.reason, got.status) == ("too_many_redirects", 302)


@pytest.mark.parametrize("target", [
    "http://169.254.169.254/latest/meta-data/",   # cloud metadata (link-local)
    "http://10.1.2.3/",                           # private
    "http://[::ffff:10.0.0.1]/",                  # private, IPv6-mapped
    "http://0.0.0.0/",                            # unspecified
    "http://224.0.0.1/",                          # multicast
    "http://intranet.test/",                      # a name that resolves to a private address
])
def test_redirect_to_a_forbidden_address_is_refused(server, target):
    resolver = lambda host, port: [(socket.AF_INET, "192.168.0.7")]  # noqa: E731
    got = timed(server.url("/redirect-to?url=" + target), resolver=resolver)
    assert got.reason == "forbidden_address" and got.final_url == target and got.redirects == 1


@pytest.mark.parametrize("target,reason", [("file:///etc/passwd", "scheme_not_allowed"), ("ftp://x/y", "scheme_not_allowed")])
def test_redirect_to_another_scheme_is_refused(server, target, reason):
    assert timed(server.url("/redirect-to?url=" + target)).reason == reason


def test_name_resolving_to_a_private_address_is_never_connected(server):
    asked = []

    def resolver(host, port):
        asked.append(host)
        return [(socket.AF_INET, "10.0.0.5")]

    before = sum(server.hits.values())
    got = timed(f"http://intranet.test:{server.port}/img/good.jpg", resolver=resolver)
    assert got.reason == "forbidden_address" and asked == ["intranet.test"]
    assert sum(server.hits.values()) == before


def test_loopback_is_refused_unless_allowed(server):
    before = server.hits["/img/good.jpg"]
    got = timed(server.url("/img/good.jpg"), FetchOptions(connect_timeout=1, deadline=2))
    assert got.reason == "forbidden_address" and server.hits["/img/good.jpg"] == before
    got = timed(server.url("/img/good.jpg", host="localhost"), FetchOptions(connect_timeout=1, deadline=2))
    assert got.reason == "forbidden_address"


def test_the_socket_connects_to_the_checked_address_without_resolving_again(server):
    """A DNS-rebinding answer has no second lookup to slip into: one resolution per hop, and
    ``http.client`` never resolves (``images.test`` does not exist for the system resolver)."""
    answers = iter([[(socket.AF_INET, "127.0.0.1")]])
    got = timed(f"http://images.test:{server.port}/img/good.jpg", resolver=lambda host, port: next(answers))
    assert got.ok and server.hosts[-1] == f"images.test:{server.port}"


def test_mixed_answers_use_only_the_allowed_addresses(server):
    resolver = lambda host, port: [(socket.AF_INET, "10.0.0.9"), (socket.AF_INET, "127.0.0.1")]  # noqa: E731
    assert timed(f"http://mixed.test:{server.port}/img/good.jpg", resolver=resolver).ok


@pytest.mark.parametrize("tag,opted_out", [
    ("noai", True), ("noimageai", True), ("noindex, nofollow", True), ("nofollow", False),
    ("alt-text-corpus: noai", True), ("otherbot: noai", False), ("NOIMAGEAI", True),
])
def test_x_robots_tag_opt_outs(server, tag, opted_out):
    got = timed(server.url("/optout?tag=" + tag.replace(" ", "%20")))
    assert got.reason == ("opted_out" if opted_out else "")


def test_opt_out_rules_as_img2dataset():
    assert is_opted_out(["img2dataset: noai"], "img2dataset", ("noai",))
    assert not is_opted_out(["img2dataset: noai"], "alt-text-corpus", ("noai",))
    assert not is_opted_out(["noai"], "x", ())


def test_the_user_agent_is_sent_and_names_our_token(server):
    options = FetchOptions(user_agent="MyCrawler/2.0 (+https://example.org/bot)", allow_loopback=True)
    assert options.agent_token() == "mycrawler"
    got = fetch(server.url("/optout?tag=mycrawler:%20noimageai"), options)
    assert got.reason == "opted_out"


@pytest.mark.parametrize("contact,sent", [
    ("https://example.org/crawler", "alt-text-corpus/1.0 (+https://example.org/crawler)"),
    ("crawler@example.org", "alt-text-corpus/1.0 (+mailto:crawler@example.org)"),
    ("", "alt-text-corpus/1.0"),
])
def test_the_user_agent_carries_the_contact_after_our_agent_name(server, contact, sent):
    options = FetchOptions(contact=contact, allow_loopback=True)
    assert fetch(server.url("/img/good.jpg"), options).ok and server.agents[-1] == sent
    assert fetch(server.url("/optout?tag=alt-text-corpus:%20noai"), options).reason == "opted_out"


@pytest.mark.parametrize("user_agent,contact", [
    ("bot/1.0", "ops at example.org"), ("bot/1.0", "https://example.org/(bot)"), ("bot/1.0", "ops@example.org; x"),
    ("bot/1.0", "javascript:alert(1)"), ("bot/1.0", "ftp://example.org/"), ("bot/1.0\r\nX-Injected: 1", ""),
    ("bøt/1.0", ""), (" ", ""),
])
def test_user_agents_and_contacts_that_would_break_the_header_are_refused(user_agent, contact):
    with pytest.raises(ValueError):
        check_user_agent(user_agent, contact)


def test_connection_refused_and_bad_urls(server):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    assert timed(f"http://127.0.0.1:{closed_port}/x.jpg").reason == "connection_error"
    assert timed("not a url").reason == "scheme_not_allowed"
    assert timed("http:///nohost.jpg").reason == "bad_url"
    assert timed("http://127.0.0.1:99999/x").reason == "bad_url"
    assert timed("http://no-such-host.invalid/x.jpg", resolver=addresses.system_resolver).reason in ("dns_error",)


def test_per_host_concurrency_is_bounded(server):
    limiter = HostLimiter(HostPolicy(concurrency=2, rate=0))
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: fetch(server.url("/slow-img"), OPTIONS, limiter=limiter), range(6)))
    assert all(r.ok for r in results)
    assert server.max_in_flight == 2


@pytest.mark.parametrize("ip,why", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("169.254.169.254", "link_local"), ("fe80::1", "link_local"),
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.1.1", "private"), ("fd00::1", "private"),
    ("100.64.0.1", "private"), ("224.0.0.251", "multicast"), ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"),
    ("::", "unspecified"), ("240.0.0.1", "reserved"), ("::ffff:127.0.0.1", "loopback"),
    ("2002:a00:1::", "private"), ("8.8.8.8", None), ("2606:4700:4700::1111", None), ("example.org", "not_an_address"),
])
def test_address_policy(ip, why):
    assert addresses.refusal(ip) == why


def test_allow_loopback_allows_only_loopback():
    assert addresses.is_allowed("127.0.0.2", allow_loopback=True) and addresses.is_allowed("::1", allow_loopback=True)
    assert not addresses.is_allowed("10.0.0.1", allow_loopback=True)
    assert not addresses.is_allowed("169.254.169.254", allow_loopback=True)


def test_concurrent_fetches_share_one_tls_context_and_limiter(server):
    """Threads of one worker share the client state; results do not mix."""
    images = {f"i{n}.jpg": jpeg(64 + n, 48, seed=n) for n in range(8)}
    with MisbehavingServer(dict(images, **{"good.jpg": jpeg(32, 32)})) as own:
        limiter, context = HostLimiter(HostPolicy(concurrency=4, rate=0)), tls_context()
        with ThreadPoolExecutor(8) as pool:
            got = dict(pool.map(
                lambda name: (name, fetch(own.url(f"/img/{name}"), OPTIONS, limiter=limiter, context=context).body),
                images))
        assert got == images


def test_https_verifies_the_certificate_for_the_name_while_connecting_to_the_checked_address(tmp_path):
    """TLS over the socket to the checked IP still verifies the certificate against the URL's host name."""
    cert, key = self_signed(tmp_path, "images.test")
    resolver = lambda host, port: [(socket.AF_INET, "127.0.0.1")]  # noqa: E731
    trusting = tls_context()
    trusting.load_verify_locations(cert)
    with MisbehavingServer(tls=(cert, key)) as server:
        url = server.url("/img/good.jpg", host="images.test")
        got = timed(url, resolver=resolver, context=trusting)
        assert got.ok and got.body == server.images["good.jpg"] and got.final_url.startswith("https://")
        assert timed(url, resolver=resolver).reason == "tls_error"  # the system's CAs do not know it
        other = server.url("/img/good.jpg", host="other.test")  # right certificate, wrong name
        assert timed(other, resolver=resolver, context=trusting).reason == "tls_error"


def test_non_ascii_and_spaces_in_paths_are_percent_encoded():
    assert _target("http://例え.jp/a b/ü.jpg?q=ä&x=1") == ("http", "xn--r8jz45g.jp", 80, "/a%20b/%C3%BC.jpg?q=%C3%A4&x=1")
    assert _target("https://x.org/%C3%BC.jpg")[3] == "/%C3%BC.jpg"  # already encoded: unchanged


def test_a_client_bug_costs_one_url_not_the_job(server):
    def broken(host, port):
        raise RuntimeError("resolver bug")

    got = fetch(f"http://broken.test:{server.port}/img/good.jpg", OPTIONS, resolver=broken)
    assert (got.reason, got.body) == ("client_error", None)
