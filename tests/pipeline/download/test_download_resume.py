"""What a build reuses of earlier builds' downloads: staging indexes, the plan per URL, what is deleted when.

The plan runs on FnApiRunner over staging files written by ``StagingWriter``
(complete and incomplete indexes); the end-to-end case builds a list twice
through ``pipeline.build.launcher`` against a loopback server that counts requests.
"""


import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.build import launcher
from pipeline.download import resume, staging
from pipeline.publish.output_contract import consumed_downloads
from tests.pipeline.download_server import MisbehavingServer, jpeg

BUILD = "20250101T000000Z-0123abcd"


@pytest.mark.parametrize("reason,reused", [
    ("http_404", True), ("http_410", True), ("opted_out", True), ("not_an_image", True), ("too_large", True),
    ("forbidden_address", True), ("http_408", False), ("http_429", False), ("http_503", False),
    ("timeout", False), ("connection_error", False), ("dns_error", False), ("host_backed_off", False),
    ("client_error", False), ("incomplete_body", False),
])
def test_a_failure_is_reused_only_when_it_is_the_urls_own_answer(reason, reused):
    assert resume.settled(reason) is reused


def test_a_staging_file_counts_once_its_index_is_complete(tmp_path):
    now = [0.0]
    writer = staging.StagingWriter(str(tmp_path), BUILD, max_records=3, max_seconds=4, clock=lambda: now[0])
    where = writer.write("http://a/1.jpg", "http://a/1.jpg", 200, b"one")
    writer.note("http://a/2.jpg", "http://a/2.jpg", 404, "http_404")
    assert not writer.due()  # 2 URLs, 0 s
    now[0] = 5.0
    assert writer.due()
    writer.close()
    index = staging.index_path(where[0])
    entries = staging.read_index(index)
    assert [(e["url"], e["ordinal"], e["reason"], e["path"]) for e in entries] == [
        ("http://a/1.jpg", 0, "", where[0]), ("http://a/2.jpg", -1, "http_404", where[0])]
    assert staging.read_body(where[0], where[2]) == b"one"
    assert staging.build_of(index.rsplit("/", 1)[1]) == BUILD
    lines = open(index).read().splitlines()
    with open(index, "w") as handle:  # a writer killed while writing its index
        handle.write("\n".join(lines[:-1]) + "\n")
    assert staging.read_index(index) is None


def _stage(directory, bodies=(), failures=()):
    writer = staging.StagingWriter(str(directory), BUILD)
    for url in bodies:
        writer.write(url, url, 200, jpeg(40, 30, seed=len(url)))
    for url, status, reason in failures:
        writer.note(url, url, status, reason)
    writer.close()


def test_the_plan_reuses_bodies_and_settled_failures_and_fetches_the_rest(tmp_path):
    _stage(tmp_path, bodies=["http://a/body.jpg"],
           failures=[("http://a/gone.jpg", 404, "http_404"), ("http://a/slow.jpg", 0, "timeout")])
    _stage(tmp_path / "other", bodies=["http://a/lost.jpg"])  # another directory: not this output's downloads
    wanted = [("http://a/body.jpg", 3), ("http://a/gone.jpg", 0), ("http://a/slow.jpg", 1), ("http://a/new.jpg", 1),
              ("http://a/lost.jpg", 1)]
    with TestPipeline(runner="FnApiRunner") as p:
        plan = p | beam.Create(wanted) | resume.PlanDownloads(str(tmp_path))
        assert_that(plan[resume.TO_FETCH], equal_to(wanted[2:]), label="ToFetch")
        assert_that(plan[resume.STAGED] | beam.Map(lambda kv: (kv[1][0], kv[1][1], kv[1][2]["ordinal"])),
                    equal_to([("http://a/body.jpg", 3, 0)]), label="Staged")
        assert_that(plan[resume.SETTLED] | beam.Map(lambda f: (f.url, f.reason, f.http_status, f.fetched)),
                    equal_to([("http://a/gone.jpg", "download/http_404", 404, False)]), label="Settled")
    with TestPipeline(runner="FnApiRunner") as p:
        plan = p | beam.Create(wanted) | resume.PlanDownloads(str(tmp_path), refetch=True)
        assert_that(plan[resume.TO_FETCH], equal_to(wanted), label="Refetch")


def test_an_incomplete_index_is_no_index(tmp_path):
    _stage(tmp_path, bodies=["http://a/body.jpg"])
    (index,) = tmp_path.glob("*.index.jsonl")
    index.write_text("\n".join(index.read_text().splitlines()[:-1]) + "\n")
    with TestPipeline(runner="FnApiRunner") as p:
        plan = p | beam.Create([("http://a/body.jpg", 1)]) | resume.PlanDownloads(str(tmp_path))
        assert_that(plan[resume.TO_FETCH], equal_to([("http://a/body.jpg", 1)]))


def test_a_commit_deletes_the_downloads_of_builds_started_no_later_indexes_first():
    older, mine, newer = "20250101T000000Z-0123abcd", "20250102T000000Z-4567abcd", "20250103T000000Z-89abcdef"
    files = [f"_downloads/{build}-{'0' * 32}{suffix}" for build in (older, mine, newer)
             for suffix in (".tfrecord", ".index.jsonl")] + ["_downloads/notes.txt", "versions/x/a.tfrecord"]
    doomed = consumed_downloads(files, mine)
    assert doomed == [f"_downloads/{b}-{'0' * 32}.index.jsonl" for b in (older, mine)] + [
        f"_downloads/{b}-{'0' * 32}.tfrecord" for b in (older, mine)]


def test_a_kept_download_is_reused_by_the_next_build_of_the_list(tmp_path):
    images = {f"p{i}.jpg": jpeg(260, 240, seed=i) for i in range(4)} | {"good.jpg": jpeg(260, 240, seed=9)}
    with MisbehavingServer(images) as server:
        rows = [(server.url(f"/img/p{i}.jpg"), f"a picture numbered {i} in the list") for i in range(4)]
        rows.append((server.url("/status/404"), "a picture that is gone now"))
        tsv = tmp_path / "urls.tsv"
        tsv.write_text("url\tcaption\n" + "".join(f"{u}\t{c}\n" for u, c in rows))
        out = tmp_path / "corpus"
        argv = ["--input", str(tsv), "--output", str(out), "--download", "--download_allow_loopback",
                "--download_retries", "0", "--set", "min_ngram_count=0"]
        first = launcher.run([*argv, "--download_keep"])
        assert sum(server.targets.values()) == 5
        assert list((out / "_downloads").glob("*.index.jsonl"))  # kept after the commit
        second = launcher.run([*argv, "--overwrite"])
        assert sum(server.targets.values()) == 5  # nothing requested again
    assert first["written"] == second["written"] and sum(second["written"].values()) == 4
    assert "5 distinct URLs: 0 fetched, 0 failed, 5 reused" in second["stages"][1]["note"]
    assert second["stages"][1]["rejected"] == {"download/http_404": 1}
    assert not list((out / "_downloads").glob("*"))  # the second build did not keep them
