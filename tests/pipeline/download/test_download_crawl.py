"""The crawl inside the real build: each distinct URL requested once, and a killed build resumed.

Loopback servers count every request they get (one server, one port, per
host: the build's politeness key is the host with its port). The build runs
through ``pipeline.build.launcher`` on FnApiRunner; the killed one runs as
``python -m pipeline.build`` in a child process, killed once the servers have
served about half of its URLs.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common import tfrecord_io as tfrecord
from corpus_paths import committed
from pipeline.build import launcher
from tests import images as made
from tests.pipeline.download_server import MisbehavingServer

NAME = "crawled"
COMMON = ["--name", NAME, "--download", "--download_allow_loopback", "--download_deadline", "5",
          "--download_retries", "0", "--set", "min_ngram_count=0"]


def images(first: int, count: int) -> dict:
    def noise(seed):  # a distinct 240x240 JPEG: a different sha256 and pHash per seed
        return made.noise(seed, (240, 240), cells=(30, 30), quality=90)

    return {f"p{i}.jpg": noise(i) for i in range(first, first + count)} | {"good.jpg": noise(10_000 + first)}


def write_tsv(path, rows):
    path.write_text("url\tcaption\n" + "".join(f"{url}\t{caption}\n" for url, caption in rows))
    return path


def written_urls(output) -> list:
    urls = []
    for path in sorted(glob.glob(str(committed(output) / f"{NAME}-*.tfrecord-*"))):
        with open(path, "rb") as handle:
            urls += [tfrecord.decode_example(p)["url"][0].decode() for p in tfrecord.read_frames(handle)]
    return urls


def requests(servers) -> dict:
    """{url: times requested} over the servers."""
    return {server.url(target): n for server in servers for target, n in server.targets.items()}


def test_each_distinct_url_is_requested_once_and_its_outcome_reaches_every_row(tmp_path):
    with MisbehavingServer(images(0, 12)) as one, MisbehavingServer(images(100, 12)) as two:
        distinct = [s.url(f"/img/p{i}.jpg") for s, first in ((one, 0), (two, 100)) for i in range(first, first + 12)]
        distinct += [one.url("/status/404"), two.url("/html")]
        rows = [(url, f"a picture numbered {i} from the list") for i, url in enumerate(distinct)]
        # 30% of the rows repeat a URL: another alt-text of the same image, or of the same failure.
        repeats = [(distinct[i % 4], f"another caption for picture {i} here") for i in range(11)]
        repeats.append((one.url("/status/404"), "the gone picture named again"))
        rows += repeats
        assert len(repeats) / len(rows) >= 0.3
        tsv = write_tsv(tmp_path / "urls.tsv", rows)
        out = tmp_path / "corpus"
        funnel = launcher.run(["--input", str(tsv), "--output", str(out), *COMMON])

        asked = requests((one, two))
    assert asked == {url: 1 for url in distinct}  # one request per distinct URL, repeats never fetched
    assert funnel["conserved"] and funnel["input"] == len(rows)
    download = funnel["stages"][1]
    assert download["stage"] == "download"
    assert download["rejected"] == {"download/http_404": 2, "download/not_an_image": 1}
    assert f"{len(distinct)} distinct URLs: 24 fetched, 2 failed, 0 reused" in download["note"]
    written = written_urls(out)
    assert sorted(written) == sorted(url for url, _ in rows if "/img/" in url)  # every alt-text of an image written
    ledger = [json.loads(line) for p in glob.glob(str(committed(out) / "stats/rejected/*.jsonl")) for line in open(p)]
    gone = [row for row in ledger if row["reason"] == "download/http_404"]
    assert len(gone) == 2 and {row["http_status"] for row in gone} == {404}


def _kill_at(child, servers, paths: int, timeout: float = 600) -> int:
    """Kills ``child`` (and its process group) once the servers have been asked for ``paths`` images."""
    stop = time.monotonic() + timeout
    while time.monotonic() < stop and child.poll() is None:
        served = sum(n for s in servers for t, n in s.targets.items() if t.startswith("/img/"))
        if served >= paths:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return served
        time.sleep(0.01)
    raise AssertionError(f"the build ended or stalled before {paths} requests (exit {child.poll()})")


@pytest.mark.slow
def test_a_build_killed_halfway_and_run_again_refetches_at_most_five_percent(tmp_path):
    count = 300
    with MisbehavingServer(images(0, count // 2)) as one, MisbehavingServer(images(1000, count // 2)) as two:
        urls = [s.url(f"/img/p{i}.jpg") for s, first in ((one, 0), (two, 1000)) for i in range(first, first + count // 2)]
        rows = [(url, f"a picture numbered {i} from the list") for i, url in enumerate(urls)]
        tsv = write_tsv(tmp_path / "urls.tsv", rows)
        out = tmp_path / "corpus"
        # Paced (20 a second per host) so that the kill lands mid-crawl; staging files indexed every 4 URLs.
        argv = ["--input", str(tsv), "--output", str(out), *COMMON, "--download_per_host_rate", "20",
                "--download_staging_urls", "4", "--download_staging_seconds", "1"]
        env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.Popen([sys.executable, "-m", "pipeline.build", *argv], env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        killed_at = _kill_at(child, (one, two), count // 2)
        first = requests((one, two))
        for server in (one, two):
            server.targets.clear()

        funnel = launcher.run(argv)  # the same command again
        second = requests((one, two))

    assert count * 0.4 <= killed_at < count
    again = [url for url in second if url in first]
    assert len(again) <= 0.05 * len(first), (len(again), len(first))
    assert set(first) | set(second) == set(urls)
    assert funnel["conserved"] and funnel["input"] == count
    assert sorted(written_urls(out)) == sorted(urls)  # every image written exactly once
    note = funnel["stages"][1]["note"]
    reused = len(first) - len(again)
    assert f"{len(second):,} fetched, 0 failed, {reused:,} reused" in note, note
    assert not glob.glob(str(out / "_downloads" / "*")), "the downloads are deleted once the build is committed"


# Two worker processes start a Beam worker each: CI's integration run. The light twin (in_process) runs the
# same crawl with its sub-keys in one process on fewer URLs, still more than the window's bound.
@pytest.mark.parametrize("workers, per_host", [(1, 24), pytest.param(2, 36, marks=pytest.mark.integration)],
                         ids=["in_process", "two_workers"])
def test_the_per_host_rate_holds_across_two_worker_processes(tmp_path, workers, per_host):
    """The crawl on two worker processes (each its own limiter): three hosts of 36 URLs each, split into three
    sub-keys apiece (12 URLs a key) that the runner spreads over both workers, stay within the host's rate as
    the servers count it (one worker's limiter per sub-key with the host's whole rate would go twice as fast).
    In process (24 URLs a host, 8 a key): a limiter per sub-key with the host's whole rate would go three times
    as fast."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from test_download_politeness import most_in_window

    from pipeline.download.crawl import Crawl
    from pipeline.download.fetch import FetchOptions
    from pipeline.download.politeness import HostPolicy
    from pipeline.download.settings import DownloadOptions

    rate, parts, window = 6.0, 3, 3.0
    assert per_host > rate * window + parts  # more URLs than the bound lets through in a window: it can fail
    options = DownloadOptions(FetchOptions(deadline=5, retries=0, allow_loopback=True), threads=8,
                              hosts=HostPolicy(concurrency=parts, rate=rate), urls_per_key=per_host // parts)
    servers = [MisbehavingServer(images(100 * k, 1)) for k in range(3)]
    for server in servers:
        server.__enter__()
    try:
        urls = [(s.url(f"/img/p{100 * k}.jpg?n={i}"), 0) for k, s in enumerate(servers) for i in range(per_host)]
        job = PipelineOptions(["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                               "--direct_num_workers=2"] if workers == 2 else ["--runner=FnApiRunner"])
        with beam.Pipeline(options=job) as p:
            _ = (p | beam.Create(urls) | beam.Reshuffle()
                 | Crawl(options, str(tmp_path), "20250101T000000Z-0123abcd")
                 | beam.Map(lambda facts: facts.reason))
    finally:
        for server in servers:
            server.__exit__(None, None, None)
    for server in servers:
        assert len(server.arrivals) == per_host  # each URL once
        # Each sub-key may start one request at once: the host's bound over the window plus one per sub-key.
        assert most_in_window(server.arrivals, window) <= rate * window + parts, most_in_window(server.arrivals, window)
