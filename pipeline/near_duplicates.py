"""The build's near-duplicate stages: evaluation images, then the corpus itself.

``RemoveNearDuplicates`` embeds the survivors of the earlier stages on the
workers (in batches, by an embedder loaded once per worker in ``setup()``)
and removes, in this order (``filters.stages``):

1. ``near_duplicate_eval``: near-duplicates of evaluation images (ALIGN
   appendix A), when the build has an evaluation index
   (``pipeline.eval_index``);
2. ``near_duplicate_corpus``: duplicates of other kept corpus images (preset
   ``dedup_in_corpus``; ``dedup.corpus_dedup``).

``dedup.transforms`` does k-means, the candidate search and verification;
``pipeline.dedup_options`` turns the preset into its options.
``WritePairsReport`` writes the matched pairs, with both thumbnails, to
``stats/near_duplicates-NNNNN-of-MMMMM.jsonl`` for the audit.
"""

from __future__ import annotations

import json
import math
from typing import List

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from filters import stages
from filters.image import thumbnail_b64
from pipeline import dedup_options
from pipeline.eval_index import AddIndexThumbnails, ReadIndexRows
from pipeline.stage_rows import HashRow, row_key
from pipeline.stats import write_text
from pipeline.verdicts import REJECTED, DropKeys
from pipeline.write import shard_of

NS = "dedup"
PAIRS = "pairs"
#: ``stats/near_duplicates-00000-of-00002.jsonl``, ... (``pipeline.audit`` reads them in order).
PAIRS_FILE_PATTERN = "near_duplicates-{index:05d}-of-{count:05d}.jsonl"
#: Report rows per pairs file: each carries two ~5 KB thumbnails, so ~20 MB a
#: file, the most one worker holds while it sorts a file.
PAIRS_PER_FILE = 2_000


class _EmbedBatches(beam.DoFn):
    def __init__(self, embedder_name: str, embedder_args=()):
        self.embedder_name = embedder_name
        self.embedder_args = tuple(embedder_args)
        self.embedded = Metrics.counter(NS, "embedded")

    def setup(self):
        from dedup import embedders

        self.embedder = embedders.get(self.embedder_name, **dict(self.embedder_args))

    def process(self, batch):
        keys = [key for key, _ in batch]
        vectors = self.embedder.embed([data for _, data in batch])
        self.embedded.inc(len(keys))
        for key, vector in zip(keys, vectors):
            yield key, np.asarray(vector, np.float32)


class EmbedImages(beam.PTransform):
    """``(key, image bytes)`` -> ``(key, unit vector)``, one row per distinct key.

    ``embedder_args``: the embedder's constructor arguments as ``(key, value)``
    pairs (``--embedder-arg``), e.g. ``(("workdir", "gs://b/run"),)`` for
    ``checkpoint``, whose workers then need the ``train`` extra (JAX).
    """

    def __init__(self, embedder_name: str, batch_size: int = 64, embedder_args=()):
        super().__init__()
        self.embedder_name = embedder_name
        self.embedder_args = tuple(embedder_args)
        self.batch_size = batch_size

    def expand(self, images):
        return (
            images
            # Repeats of one (url, alt-text) pair share a key; embed one of them,
            # chosen by content so that runs agree.
            | "OnePerKey" >> beam.CombinePerKey(min)
            | "Batch" >> beam.BatchElements(min_batch_size=8, max_batch_size=self.batch_size)
            | "Embed" >> beam.ParDo(_EmbedBatches(self.embedder_name, self.embedder_args))
        )


def rejection_order(rejection) -> tuple:
    """Which of a key's repeated rejections shows its image: the smallest, so runs agree."""
    return rejection.width, rejection.height, rejection.format, rejection.image or b""


def first_rejection(rejections):
    """One rejection of a key (a combiner: a key repeated 100k times is never one list)."""
    return min(rejections, key=rejection_order)


def pair_rows(element) -> List[dict]:
    """Join of pairs with the corpus record's rejection -> report rows with the corpus thumbnail.

    ``index_thumbnail`` is filled in by ``AddIndexThumbnails``.
    """
    _, grouped = element
    rejections = list(grouped["rejection"])
    corpus_thumb = thumbnail_b64(first_rejection(rejections).image) if rejections else None
    rows = []
    for pair in sorted(grouped["pair"], key=lambda p: (-p["cosine"], p["index_set"], p["index_key"])):
        row = dict(pair, cosine=round(float(pair["cosine"]), 6))
        row["thumbnail"] = corpus_thumb
        row["index_thumbnail"] = None
        rows.append(row)
    return rows




def pairs_files_for(count: int, per_file: int = PAIRS_PER_FILE) -> int:
    """Number of pairs files for ``count`` report rows: at least one (an empty file says "none found")."""
    return max(1, math.ceil(count / per_file))


def pairs_path(output_dir: str, index: int, count: int) -> str:
    return FileSystems.join(output_dir, "stats", PAIRS_FILE_PATTERN.format(index=index, count=count))


def row_order(row: dict) -> tuple:
    return row["key"], row["index_set"], row["index_key"]


class _WritePairsFile(beam.DoFn):
    """One file's rows (its key-hash share of the report), sorted, so runs agree byte for byte."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def process(self, element, num_files):
        index, grouped = element
        rows = sorted(grouped["rows"], key=row_order)
        write_text(pairs_path(self.output_dir, index, num_files), "".join(json.dumps(r) + "\n" for r in rows))
        yield index, len(rows)


def _hash_rows(light):
    """Light rows -> one ``HashRow`` per key (repeats of a pair share a key and its image)."""
    return (
        light
        | "HashesPerKey" >> beam.Map(lambda row: (row.key, (row.sha256, row.phash)))
        | "OneHashPerKey" >> beam.CombinePerKey(min)
        | "HashRows" >> beam.MapTuple(lambda key, hashes: HashRow(key, *hashes)).with_output_types(HashRow)
    )


class RemoveNearDuplicates(beam.PTransform):
    """``{"images": (key, bytes), "light": LightRow, "earlier": (key, reason)}`` -> ``{"rejected", "pairs"}``.

    ``earlier`` are the verdicts of the stages before; their keys are neither
    searched nor kept as representatives. ``rejected``: ``(key, reason)``
    verdicts of both near-duplicate stages that run; ``pairs`` (with an
    evaluation index): the matched pairs for ``WritePairsReport``.
    """

    def __init__(self, embedder_name: str, preset, eval_index=None, embedder_args=()):
        super().__init__()
        if eval_index is None and not preset.dedup_in_corpus:
            raise ValueError("neither an evaluation index nor dedup_in_corpus: nothing to remove")
        self.embedder_name = embedder_name
        self.embedder_args = tuple(embedder_args)
        self.preset = preset
        self.eval_index = eval_index
        self.decides = (("near_duplicate_eval",) if eval_index is not None else ()) + (
            ("near_duplicate_corpus",) if preset.dedup_in_corpus else ()
        )
        self.notes = {"near_duplicate_eval": eval_index.note} if eval_index is not None else {}
        if preset.dedup_in_corpus:
            self.corpus_threshold = (
                eval_index.threshold if eval_index is not None
                else dedup_options.resolve_threshold(preset, dedup_options.embedder(embedder_name, self.embedder_args))
            )
            self.notes["near_duplicate_corpus"] = (
                f"same sha256, same pHash, or embedding cosine > {self.corpus_threshold} "
                f"(embedder {embedder_name}; k-means buckets C({preset.nearest_clusters},{preset.bucket_size}))"
            )

    def expand(self, inputs):
        preset, eval_index = self.preset, self.eval_index
        embedded = inputs["images"] | "EmbedImages" >> EmbedImages(self.embedder_name, embedder_args=self.embedder_args)
        earlier = inputs["earlier"]
        verdicts, outputs = [], {}
        if eval_index is not None:
            from dedup import transforms

            candidates = (embedded, earlier) | "DropEarlierRejects" >> DropKeys()
            # The index is read from files on a worker: in the graph it would be
            # its whole size (Dataflow rejects graphs over 10 MB).
            index_rows = embedded.pipeline | "ReadEvalIndex" >> ReadIndexRows(eval_index.directory)
            found = candidates | "MatchEvalImages" >> transforms.RemoveNearDuplicates(
                index_rows, threshold=eval_index.threshold, search=preset.near_duplicate_search,
                **dedup_options.search_options(preset),
            )
            verdicts.append(found[REJECTED])
            outputs[PAIRS] = found[PAIRS]
        if preset.dedup_in_corpus:
            from dedup.corpus_dedup import RemoveCorpusDuplicates

            earlier = [earlier] + verdicts | "VerdictsBeforeCorpusDedup" >> beam.Flatten()
            hashes = (_hash_rows(inputs["light"]), earlier) | "DropRejectedHashes" >> DropKeys(row_key)
            vectors = (embedded, earlier) | "DropRejectedEmbeddings" >> DropKeys()
            # Always a bucket self-join (dedup.corpus_dedup): near_duplicate_search
            # applies to the evaluation index only.
            verdicts.append(hashes | "RemoveCorpusDuplicates" >> RemoveCorpusDuplicates(
                vectors, self.corpus_threshold, **dedup_options.search_options(preset)))
        outputs[REJECTED] = verdicts | "NearDuplicateVerdicts" >> beam.Flatten()
        return outputs


class WritePairsReport(beam.PTransform):
    """``(pairs, rejections)`` -> ``stats/near_duplicates-*.jsonl``: each matched pair with both thumbnails.

    The corpus thumbnail comes from the record's ``Rejection`` (after
    ``JoinVerdicts``, the only place that holds its image; one per key, by a
    combine), the evaluation image's from the index files. The rows are
    spread over ``ceil(rows / per_file)`` files by key hash, each written by
    the worker that holds it (never the whole report in one list), sorted
    by (key, index_set, index_key) inside a file; with no pair at all one
    empty file says the search ran and found none.
    """

    def __init__(self, index_directory: str, output_dir: str, per_file: int = PAIRS_PER_FILE):
        super().__init__()
        self.index_directory = index_directory
        self.output_dir = output_dir
        self.per_file = per_file

    def expand(self, inputs):
        pairs, rejections = inputs
        near_dup_rejects = (
            rejections
            | "NearDuplicateRejects" >> beam.Filter(lambda r: stages.stage_of(r.reason) == "near_duplicate_eval")
            | "KeyNearDuplicateRejects" >> beam.Map(lambda r: (r.key, r))
            | "OneRejectionPerKey" >> beam.CombinePerKey(first_rejection)
        )
        rows = (
            {"pair": pairs | "KeyPairs" >> beam.Map(lambda d: (d["key"], d)), "rejection": near_dup_rejects}
            | "GroupPairs" >> beam.CoGroupByKey()
            | "PairRows" >> beam.FlatMap(pair_rows)
            | "IndexThumbnails" >> AddIndexThumbnails(self.index_directory)
        )
        per_file = self.per_file
        num_files = rows | "CountPairs" >> beam.combiners.Count.Globally() | "PairsFiles" >> beam.Map(
            pairs_files_for, per_file)
        files = beam.pvalue.AsSingleton(num_files)
        return (
            {
                "rows": rows | "PairsFileOf" >> beam.Map(lambda row, n: (shard_of(row["key"], n), row), n=files),
                # Every file index, so a file with no rows is written too.
                "file": num_files | "FileIndices" >> beam.FlatMap(lambda n: [(i, None) for i in range(n)]),
            }
            | "GroupPairsFile" >> beam.CoGroupByKey()
            | "WritePairsFile" >> beam.ParDo(_WritePairsFile(self.output_dir), files)
        )
