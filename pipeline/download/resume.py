"""Resume: what earlier builds of this output downloaded is reused, and only the rest is fetched.

    (url, needs) + the complete staging indexes of OUTPUT/_downloads/
        --CoGroupByKey per URL--> to fetch (url, needs)
                                  staged  (bodies file, (url, needs, entry))  -> JudgeStaged -> ImageFactsRow
                                                                                 (a damaged body: to fetch)
                                  settled ImageFactsRow (a failure that is an outcome)

Every complete sidecar index (``staging.read_index``) is read and keyed by
URL, and joined with the build's distinct URLs: a keyed join, never a side
input of all URLs. Per URL, the first of these wins:

1. a staged body (the smallest ``(file, ordinal)`` when a URL was staged
   twice, e.g. by a bundle the runner retried): reused; the image is judged
   again from the staging file, under this build's preset;
2. a failure that is an outcome of the URL itself (``SETTLED``: 404,
   opted out, not an image, too large, a refused address, ...): reused as
   it was;
3. otherwise (never seen, or only failures that a later try may not meet:
   timeouts, refused connections, DNS failures, 429 and 5xx, a host that
   asked us to wait, ``client_error``): fetched again.

``--download_refetch`` skips the indexes: every URL is fetched.

Counter (namespace ``download``): ``reused`` (URLs settled by an earlier
build's staging file: bodies and failures).
"""

from __future__ import annotations

import re

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.metrics import Metrics

from common import tfrecord_io as tfrecord
from common.files import escape_glob
from pipeline.download import staging
from pipeline.download.image_facts import ImageFactsRow, failed_facts

NAMESPACE = "download"
TO_FETCH, STAGED, SETTLED = "to_fetch", "staged", "settled"

#: Download failures that are the URL's own answer: fetching again would get the same.
_SETTLED = frozenset({
    "bad_url", "scheme_not_allowed", "forbidden_address", "too_many_redirects", "opted_out", "not_an_image",
    "too_large", "empty_body", "protocol_error", "tls_error",
})


def settled(reason: str) -> bool:
    """Whether a failed download (``fetch``'s reason) is an outcome a later build reuses, not retries.

    An HTTP 4xx is the server's answer about the URL, except 408 (request
    timeout) and 429 (too many requests); 5xx, timeouts, connection and DNS
    failures are the moment's, and are tried again.
    """
    if reason in _SETTLED:
        return True
    found = re.fullmatch(r"http_(\d{3})", reason)
    return bool(found) and 400 <= int(found.group(1)) < 500 and int(found.group(1)) not in (408, 429)


def _choose(element):
    """One URL's wish and what the indexes hold of it -> fetch it, judge its staged body, or reuse its failure."""
    url, grouped = element
    wishes = list(grouped["want"])
    if not wishes:
        return
    needs = 0
    for wish in wishes:
        needs |= wish
    entries = list(grouped["have"])
    bodies = sorted((e for e in entries if not e["reason"]), key=lambda e: (e["path"], e["ordinal"]))
    if bodies:
        yield beam.pvalue.TaggedOutput(STAGED, (bodies[0]["path"], (url, needs, bodies[0])))
        return
    outcomes = sorted((e for e in entries if settled(e["reason"])), key=lambda e: e["path"])
    if outcomes:
        entry = outcomes[0]
        yield beam.pvalue.TaggedOutput(SETTLED, failed_facts(
            url, f"download/{entry['reason']}", entry["status"], entry["final_url"], fetched=False))
        return
    yield url, needs


def _index_entries(path: str):
    for entry in staging.read_index(path) or ():  # an incomplete index: its file is not reused
        yield entry["url"], entry


class PlanDownloads(beam.PTransform):
    """``(url, needs)`` -> ``{"to_fetch": (url, needs), "staged": (file, (url, needs, entry)), "settled": facts}``."""

    def __init__(self, staging_dir: str, refetch: bool = False):
        super().__init__()
        self.staging_dir = staging_dir
        self.refetch = refetch

    def expand(self, urls):
        if self.refetch:
            empty = urls.pipeline | "NothingStaged" >> beam.Create([])
            return {TO_FETCH: urls, STAGED: empty,
                    SETTLED: empty | "NothingSettled" >> beam.Map(lambda x: x).with_output_types(ImageFactsRow)}
        pattern = escape_glob(self.staging_dir.rstrip("/")) + "/*" + staging.INDEX
        entries = (
            urls.pipeline
            | "MatchStagingIndexes" >> fileio.MatchFiles(pattern, fileio.EmptyMatchTreatment.ALLOW)
            | "IndexPaths" >> beam.Map(lambda metadata: metadata.path)
            | "SpreadIndexes" >> beam.Reshuffle()
            | "IndexEntries" >> beam.FlatMap(_index_entries)
        )
        planned = (
            {"want": urls, "have": entries}
            | "UrlsAndStaged" >> beam.CoGroupByKey()
            | "Choose" >> beam.FlatMap(_choose).with_outputs(STAGED, SETTLED, main=TO_FETCH)
        )
        return {TO_FETCH: planned[TO_FETCH], STAGED: planned[STAGED],
                SETTLED: planned[SETTLED] | "CountSettled" >> beam.Map(_counted).with_output_types(ImageFactsRow)}


def _counted(facts: ImageFactsRow) -> ImageFactsRow:
    Metrics.counter(NAMESPACE, "reused").inc()
    return facts


class _JudgeStaged(beam.DoFn):
    """``(staging file, [(url, needs, entry), ...])`` -> each URL's facts, its image judged from the file."""

    def __init__(self, image_judge, max_record_bytes: int):
        self.image_judge = image_judge
        self.max_record_bytes = max_record_bytes
        self.reused = Metrics.counter(NAMESPACE, "reused")

    def setup(self):
        if self.image_judge is not None:
            self.image_judge.setup()

    def process(self, element):
        from pipeline.download.image_facts import unjudged_facts

        path, wanted = element
        items = []
        for url, needs, entry in sorted(wanted, key=lambda w: w[2]["offset"]):
            body = _read(path, entry["offset"], self.max_record_bytes)
            if body is None:  # damaged since it was written: fetched again
                yield beam.pvalue.TaggedOutput(TO_FETCH, (url, needs))
                continue
            items.append((url, body, needs, (entry["status"], entry["final_url"], path, entry["ordinal"],
                                             entry["offset"], False)))
            if len(items) >= 64:
                yield from self._judged(items, unjudged_facts)
                items = []
        yield from self._judged(items, unjudged_facts)

    def _judged(self, items, unjudged_facts):
        self.reused.inc(len(items))
        if self.image_judge is None:
            return [unjudged_facts(url, where) for url, _, _, where in items]
        return self.image_judge.judge(items)


def _read(path: str, offset: int, max_record_bytes: int):
    """The body, or None where the bytes are damaged; the file system's errors are raised (the runner retries)."""
    try:
        return staging.read_body(path, offset, max_record_bytes)
    except (tfrecord.FrameError, ValueError):
        return None


class JudgeStaged(beam.PTransform):
    """Reused staged bodies, grouped by file (at most ``staging_urls`` each), judged as fetched ones are.

    ``{"facts": ImageFactsRow, "to_fetch": (url, needs)}``: a body damaged since it was staged is fetched again.
    """

    def __init__(self, image_judge, max_record_bytes: int):
        super().__init__()
        self.image_judge = image_judge
        self.max_record_bytes = max_record_bytes

    def expand(self, staged):
        judged = (
            staged
            | "ByStagingFile" >> beam.GroupByKey()
            | "ReadAndJudge" >> beam.ParDo(_JudgeStaged(self.image_judge, self.max_record_bytes))
            .with_outputs(TO_FETCH, main="facts")
        )
        return {"facts": judged["facts"], TO_FETCH: judged[TO_FETCH]}
