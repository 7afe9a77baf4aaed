"""The build's near-duplicate stages: evaluation images, then the corpus itself.

1. ``near_duplicate_eval``: near-duplicates of evaluation images (ALIGN
   appendix A). Every record that passes the per-record rules is matched
   against the evaluation index as the first pass reads it
   (``pipeline.stages.judge``, ``pipeline.stages.eval_index``); its light row carries the
   match, and the pairs found carry the corpus image's thumbnail.
   ``WritePairsReport`` writes the pairs of the records that this stage
   rejected, with both thumbnails, to
   ``stats/near_duplicates-NNNNN-of-MMMMM.jsonl`` for the audit.
2. ``near_duplicate_corpus``: duplicates of other kept corpus images (preset
   ``dedup_in_corpus``; ``dedup.corpus_dedup``), on the hashes of the light
   rows and the embeddings the first pass made (``RemoveCorpusNearDuplicates``).

``dedup.preset_options`` turns the preset into the search options.
"""

from __future__ import annotations

import json
import math

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common.files import write_text
from common.schema import shard_of
from dedup import preset_options as dedup_options
from filters import stages
from pipeline.stages.eval_index import AddIndexThumbnails
from pipeline.stages.light_rows import HashRow, row_key
from pipeline.stages.verdicts import DropKeys

PAIRS = "pairs"
#: ``stats/near_duplicates-00000-of-00002.jsonl``, ... (``pipeline.audit`` reads them in order).
PAIRS_FILE_PATTERN = "near_duplicates-{index:05d}-of-{count:05d}.jsonl"
#: Report rows per pairs file: each carries two ~5 KB thumbnails, so ~20 MB a
#: file, the most one worker holds while it sorts a file.
PAIRS_PER_FILE = 2_000


def corpus_dedup_note(preset, threshold: float, embedder_name: str) -> str:
    return (f"same sha256, same pHash, or embedding cosine > {threshold} "
            f"(embedder {embedder_name}; k-means buckets C({preset.nearest_clusters},{preset.bucket_size}))")


def _hash_rows(light):
    """Light rows -> one ``HashRow`` per key (repeats of a pair share a key and its image)."""
    return (
        light
        | "HashesPerKey" >> beam.Map(lambda row: (row.key, (row.sha256, row.phash)))
        | "OneHashPerKey" >> beam.CombinePerKey(min)
        | "HashRows" >> beam.MapTuple(lambda key, hashes: HashRow(key, *hashes)).with_output_types(HashRow)
    )


def _smallest_vector(vectors):
    return min(vectors, key=lambda v: v.tobytes())


class RemoveCorpusNearDuplicates(beam.PTransform):
    """``{"light": LightRow, "embeddings": (key, vector), "earlier": (key, reason)}`` -> ``(key, reason)`` verdicts.

    ``earlier`` are the verdicts of the stages before; their keys are neither
    searched nor kept as representatives. Always a bucket self-join
    (``dedup.corpus_dedup``): ``near_duplicate_search`` applies to the
    evaluation index only.
    """

    decides = ("near_duplicate_corpus",)

    def __init__(self, preset, threshold: float, embedder_name: str):
        super().__init__()
        self.preset = preset
        self.threshold = threshold
        self.notes = {"near_duplicate_corpus": corpus_dedup_note(preset, threshold, embedder_name)}

    def expand(self, inputs):
        from dedup.corpus_dedup import RemoveCorpusDuplicates

        earlier = inputs["earlier"]
        hashes = (_hash_rows(inputs["light"]), earlier) | "DropRejectedHashes" >> DropKeys(row_key)
        vectors = (
            inputs["embeddings"]
            # Repeats of one (url, alt-text) pair share a key: one vector, chosen by content so that runs agree.
            | "OneVectorPerKey" >> beam.CombinePerKey(_smallest_vector)
        )
        vectors = (vectors, earlier) | "DropRejectedEmbeddings" >> DropKeys()
        return hashes | "RemoveCorpusDuplicates" >> RemoveCorpusDuplicates(
            vectors, self.threshold, **dedup_options.search_options(self.preset))


def _pairs_of_rejected(element):
    _, grouped = element
    if grouped["rejected"]:
        for pair in sorted(grouped["pair"], key=lambda p: (-p["cosine"], p["index_set"], p["index_key"])):
            yield dict(pair, index_thumbnail=None)


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


class WritePairsReport(beam.PTransform):
    """``(pairs, rejections)`` -> ``stats/near_duplicates-*.jsonl``: each matched pair with both thumbnails.

    Only the pairs of records that ``near_duplicate_eval`` rejected (an
    earlier stage's verdict wins over the match). The corpus thumbnail came
    with the pair from the first pass, the evaluation image's comes from
    the index files. The rows are spread over ``ceil(rows / per_file)``
    files by key hash, each written by the worker that holds it (never the
    whole report in one list), sorted by (key, index_set, index_key) inside
    a file; with no pair at all one empty file says the search ran and found none.
    """

    def __init__(self, index_directory: str, output_dir: str, per_file: int = PAIRS_PER_FILE):
        super().__init__()
        self.index_directory = index_directory
        self.output_dir = output_dir
        self.per_file = per_file

    def expand(self, inputs):
        pairs, rejections = inputs
        rejected_keys = (
            rejections
            | "NearDuplicateRejects" >> beam.Filter(lambda r: stages.stage_of(r.reason) == "near_duplicate_eval")
            | "RejectedKeys" >> beam.Map(lambda r: (r.key, 1))
            | "OncePerKey" >> beam.CombinePerKey(sum)
        )
        rows = (
            {"pair": pairs | "KeyPairs" >> beam.Map(lambda d: (d["key"], d)), "rejected": rejected_keys}
            | "GroupPairs" >> beam.CoGroupByKey()
            | "PairRows" >> beam.FlatMap(_pairs_of_rejected)
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
