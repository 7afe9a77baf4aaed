"""The download stage inside the real build (FnApiRunner), against the misbehaving loopback server.

A TSV URL list with one URL per case (``download_server``) goes through
``python -m pipeline.build --download``: every URL ends written or rejected
with the right ``download/<reason>``, the funnel's input is the number of
URLs, the ledger keeps HTTP status and final URL, and so do the shards.
"""

import glob
import json
import socket

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

import repo_root
from common import tfrecord_io as tfrecord
from common.schema import Candidate, make_key
from corpus_paths import committed
from pipeline.build import launcher
from pipeline.download import settings as download_settings
from pipeline.download import stage as download_stage
from pipeline.download.fetch import FetchOptions
from tests.pipeline.download_server import MisbehavingServer, jpeg

NAME = "downloaded"
LIMITS = [
    # Generous for a loaded machine (the endless body must hit max-bytes before the deadline);
    # the drip still needs ~5000 s to finish, so it always ends at the deadline.
    "--download_allow_loopback", "--download_connect_timeout", "2", "--download_read_timeout", "2",
    "--download_deadline", "4", "--download_max_bytes", "300000", "--download_retries", "1",
    "--download_threads", "16", "--download_per_host", "8", "--set", "min_ngram_count=0",
]
IMAGES = {"a.jpg": jpeg(400, 300, seed=1), "b.png": jpeg(320, 480, seed=2, fmt="PNG"), "good.jpg": jpeg(360, 360, seed=3),
          "wide.jpg": jpeg(900, 600, seed=4)}


def cases(server):
    """(url, caption, expected fate): "written" or the first rejection reason."""
    u = server.url
    return [
        (u("/img/a.jpg"), "a red barn in a wide green field", "written"),
        (u("/img/b.png"), "a tall lighthouse on a rocky coast", "written"),
        (u("/img/wide.jpg"), "a wide view over the old harbour", "written"),  # stored resized to 512
        (u("/redirect/2"), "a blue kite above the sandy dunes", "written"),
        (u("/flaky/t1?fail=1&status=429&after=0"), "a small boat on a calm lake", "written"),
        (u("/status/404"), "a photo that is no longer there", "download/http_404"),
        (u("/status/500"), "a server that fails on this photo", "download/http_500"),
        (u("/drip"), "a photo that drips in byte by byte", "download/timeout"),
        (u("/endless"), "a photo that never ends at all", "download/too_large"),
        (u("/huge"), "a photo that says it is huge", "download/too_large"),
        (u("/short"), "a photo cut off halfway through", "download/incomplete_body"),
        (u("/html"), "an html page served for a photo", "download/not_an_image"),
        (u("/redirect/9"), "a photo behind too many redirects", "download/too_many_redirects"),
        (u("/redirect-to?url=http://169.254.169.254/latest/meta-data/"), "a redirect to the metadata server",
         "download/forbidden_address"),
        ("http://10.0.0.1/photo.jpg", "a photo on a private network", "download/forbidden_address"),
        (u("/optout?tag=noai"), "a photo whose owner opted out", "download/opted_out"),
        ("ftp://example.org/photo.jpg", "a photo on an ftp server", "download/scheme_not_allowed"),
        (u("/img/a.jpg"), "cat", "text_length/too_few_words"),  # downloaded, then judged by the filters
    ]


def SERVER():  # noqa: N802 (the name the fixture ``server`` reads, tests/conftest.py)
    return MisbehavingServer(dict(IMAGES))


def write_tsv(path, rows):
    path.write_text("url\tcaption\n" + "".join(f"{url}\t{caption}\n" for url, caption, _ in rows))
    return path


def fates(corpus):
    """{url: "written" | reason} and {url: ledger line} / {url: shard features}."""
    corpus = committed(corpus)
    fate, ledger, shards = {}, {}, {}
    for path in sorted(glob.glob(str(corpus / f"{NAME}-*.tfrecord-*"))):
        with open(path, "rb") as handle:
            for payload in tfrecord.read_frames(handle):
                features = {k: v[0] for k, v in tfrecord.decode_example(payload).items()}
                url = features["url"].decode()
                fate[url], shards[url] = "written", features
    for path in sorted(glob.glob(str(corpus / "stats" / "rejected" / "*.jsonl"))):
        for line in open(path):
            row = json.loads(line)
            assert row["url"] not in fate or row["reason"].startswith("text_length")
            fate.setdefault(row["url"], row["reason"])
            ledger[row["url"]] = row
    return fate, ledger, shards


def test_build_downloads_a_url_list_and_accounts_for_every_url(tmp_path, server):
    rows = cases(server)
    tsv = write_tsv(tmp_path / "urls.tsv", rows)
    corpus = tmp_path / "corpus"
    funnel = launcher.run(["--input", str(tsv), "--output", str(corpus), "--name", NAME, "--download", *LIMITS])

    assert funnel["conserved"] and funnel["input"] == len(rows)  # URLs in == the funnel's input
    stages = [row["stage"] for row in funnel["stages"]]
    assert stages[:3] == ["read", "download", "image_header"]
    download_row = funnel["stages"][1]
    assert download_row["in"] == len(rows) and "per host" in download_row["note"]
    fate, ledger, shards = fates(corpus)
    assert sum(1 for _, _, e in rows if e == "written") == sum(funnel["written"].values())
    for url, caption, expected in rows:
        if expected.startswith("download/") or expected == "written":
            assert fate[url] == expected, url
    short = next(row for url, row in ledger.items() if row["reason"] == "text_length/too_few_words")
    assert short["key"] == make_key(server.url("/img/a.jpg"), "cat")
    assert funnel["stages"][1]["rejected"] == {
        r: sum(1 for _, _, e in rows if e == r) for r in sorted({e for _, _, e in rows if e.startswith("download/")})
    }

    # The ledger keeps what the server said; the shards keep it for written records.
    assert ledger[server.url("/status/404")]["http_status"] == 404
    metadata = server.url("/redirect-to?url=http://169.254.169.254/latest/meta-data/")
    assert ledger[metadata]["final_url"] == "http://169.254.169.254/latest/meta-data/"
    assert ledger["http://10.0.0.1/photo.jpg"]["http_status"] == 0
    redirected = shards[server.url("/redirect/2")]
    assert redirected["source_final_url"].decode() == server.url("/img/good.jpg")
    assert redirected["source_http_status"] == b"200"
    a = shards[server.url("/img/a.jpg")]
    assert a["image"] == IMAGES["a.jpg"]  # a JPEG is stored as it came
    assert (a["original_width"], a["original_height"]) == (400, 300)
    assert (shards[server.url("/img/b.png")]["original_width"], shards[server.url("/img/b.png")]["original_height"]) == (320, 480)
    wide = shards[server.url("/img/wide.jpg")]
    assert (wide["original_width"], wide["original_height"]) == (900, 600)  # the source size, before the resize
    assert (wide["width"], wide["height"]) == (512, 341)

    metrics = json.loads((committed(corpus) / "stats" / "metrics.json").read_text())
    assert metrics["download/http_404"] == 1 and metrics["download/timeout"] == 1


def test_without_download_a_url_list_is_not_downloaded_and_the_funnel_has_no_download_stage(tmp_path, server):
    rows = cases(server)[:3]
    tsv = write_tsv(tmp_path / "urls.tsv", rows)
    before = sum(server.hits.values())
    funnel = launcher.run(["--input", str(tsv), "--output", str(tmp_path / "corpus"), "--name", NAME])
    assert funnel["stages"][0]["rejected"] == {"read/not_downloaded": 3}
    assert "download" not in [row["stage"] for row in funnel["stages"]]
    assert "--download" in funnel["stages"][0]["note"]
    assert sum(server.hits.values()) == before


def test_loopback_is_refused_by_the_build_unless_allowed(tmp_path, server):
    rows = cases(server)[:2]
    tsv = write_tsv(tmp_path / "urls.tsv", rows)
    funnel = launcher.run(["--input", str(tsv), "--output", str(tmp_path / "corpus"), "--name", NAME, "--download"])
    assert funnel["stages"][1]["rejected"] == {"download/forbidden_address": 2}


@pytest.mark.parametrize("flag,value", [("--download_threads", "0"), ("--download_deadline", "0"),
                                        ("--download_max_bytes", "0"), ("--download_retries", "-1"),
                                        ("--download_per_host_rate", "-1"), ("--download_dns_ttl", "-5"),
                                        ("--download_urls_per_key", "0"), ("--download_staging_seconds", "0"),
                                        ("--download_contact", "ops at example.org"),
                                        ("--download_user_agent", "bot/1 \u00e9")])
def test_bad_download_flags_are_usage_errors(tmp_path, flag, value):
    tsv = write_tsv(tmp_path / "urls.tsv", [("http://example.org/x.jpg", "a photo", "")])
    with pytest.raises(launcher.UsageError, match=flag):
        launcher.run(["--input", str(tsv), "--output", str(tmp_path / "corpus"), "--download", flag, value])
    assert not (tmp_path / "corpus").exists()


def test_the_hyphenated_spelling_of_a_download_flag_is_refused_naming_the_right_one(tmp_path):
    tsv = write_tsv(tmp_path / "urls.tsv", [("http://example.org/x.jpg", "a photo", "")])
    with pytest.raises(launcher.UsageError) as error:
        launcher.run(["--input", str(tsv), "--output", str(tmp_path / "corpus"), "--download",
                      "--download-per-host-rate=2"])
    assert str(error.value) == ("--download-per-host-rate: options are spelled with underscores here: "
                                "--download_per_host_rate")
    assert not (tmp_path / "corpus").exists()


def test_stage_with_a_resolver_hook_refuses_a_name_that_resolves_privately(server, tmp_path):
    """The composite on a real runner: a name resolving to 10.x is refused; a fetched body lands in a staging file."""
    from filters.presets import get_preset
    from pipeline.download import staging
    from pipeline.stages import judge

    resolver = lambda host, port: [(socket.AF_INET, "10.9.8.7") if host == "intranet.test" else (socket.AF_INET, "127.0.0.1")]  # noqa: E731
    inside = Candidate(key="k1", url="http://intranet.test/secret.jpg", alt_text="a secret")
    public = Candidate(key="k2", url=f"http://images.test:{server.port}/img/a.jpg", alt_text="an image of a barn")
    options = download_settings.DownloadOptions(FetchOptions(deadline=2, connect_timeout=1, allow_loopback=True), threads=2)
    record_judge = judge.RecordJudge(get_preset("align", nsfw_threshold=1.0))
    with TestPipeline(runner="FnApiRunner") as p:
        out = p | beam.Create([inside, public]) | download_stage.DownloadImages(
            record_judge, str(tmp_path), "20250101T000000Z-0123abcd", options, resolver)
        assert_that(out["rows"] | beam.Map(lambda r: (r.key, r.reason, r.reader, r.ordinal, json.loads(r.detail or "{}"))),
                    equal_to([("k1", "download/forbidden_address", "", -1, {"http_status": 0, "final_url": inside.url}),
                              ("k2", "", "staging", 0, {})]))
    (path,) = tmp_path.glob("*.tfrecord")
    assert path.name.startswith("20250101T000000Z-0123abcd-")
    (staged,) = staging.read_file(str(path))
    assert staged.image == IMAGES["a.jpg"] and staged.url == public.url
    index = staging.read_index(staging.index_path(str(path)))
    assert sorted((e["url"], e["ordinal"], e["reason"]) for e in index) == sorted([
        (inside.url, -1, "forbidden_address"), (public.url, 0, "")])


def test_docs_list_every_download_option_with_its_default():
    import argparse
    import os
    import re

    parser = argparse.ArgumentParser()
    download_settings.add_arguments(parser)
    page = open(os.path.join(repo_root.ROOT, "docs", "downloading.md")).read()
    rows = dict(re.findall(r"^\| `(--download[a-z_]*)` \| ([^|]*) \|", page, re.M))
    flags = {a.option_strings[0]: a.default for a in parser._actions if a.option_strings[0].startswith("--download")}
    assert set(rows) == set(flags)
    for flag, default in flags.items():
        shown = rows[flag].strip().strip("`")
        assert shown == ("off" if default is False else "none" if default == "" else
                         f"{default:g}" if isinstance(default, float) else str(default)), flag
