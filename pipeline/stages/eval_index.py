"""The evaluation index as files: written by the launcher, read by the workers.

ALIGN removes training images that are near-duplicates of the test sets of
downstream tasks (appendix A). The evaluation sets are read and embedded
once, in the launcher (they are small: ``embed_eval_sets``), and written as
files under the build output (``write_eval_index``); the workers read them
back (``load_clustered_index`` for the search, ``AddIndexThumbnails`` for the
report), so the job graph holds only their path. Dataflow rejects graphs over 10 MB, and an index of
1e5 rows of 143 floats is 57 MB.

    <output>/near_duplicates/index/vectors.npy       float32 [M, D], row i of the index
    <output>/near_duplicates/index/rows.jsonl        {"set", "key", "variant"} of row i
    <output>/near_duplicates/index/centroids.npy     float32 [K, D], k-means centroids of the index rows
    <output>/near_duplicates/index/thumbnails.jsonl  {"set", "key", "thumbnail"} per image

The centroids are trained in the launcher on the index itself
(``dedup.transforms.index_centroids``), so that the build's first pass can
match every corpus image as it reads it (``load_clustered_index``).
"""

from __future__ import annotations

import io
import json
from typing import Dict, NamedTuple, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from common.files import escape_glob
from common.files import read_bytes as _read
from common.files import write_bytes as _write
from dedup import preset_options as dedup_options
from filters.image import thumbnail_b64

INDEX_DIR = ("near_duplicates", "index")
VECTORS_FILE = "vectors.npy"
ROWS_FILE = "rows.jsonl"
CENTROIDS_FILE = "centroids.npy"
THUMBNAILS_FILE = "thumbnails.jsonl"


class EvalIndex(NamedTuple):
    """The evaluation index as the job sees it: the directory of its files, the threshold, a note."""

    directory: str
    threshold: float
    note: str


def embed_eval_sets(sets: Sequence[Tuple[str, str]], embedder, embedder_name: str, threshold: float, preset):
    """The evaluation sets (``(name, path)``, names distinct) read and embedded in memory with ``embedder``, in the
    launcher (the output is not touched yet).

    Returns ``(index, threshold, note)`` for ``write_eval_index``.
    """
    from dedup.index_sets import load_index_sets

    index = load_index_sets(sets, embedder)
    note = (
        f"{index.num_images} evaluation images ({len(index)} rows with variants) "
        f"from {', '.join(f'{name}={path}' for name, path in sets)}; embedder {embedder_name}, cosine > {threshold}, "
        f"{preset.near_duplicate_search} search"
    )
    return index, threshold, note


def index_digest(loaded, embedder_name: str, embedder_args, preset) -> str:
    """The sha256 of what the evaluation search compares against: the embedded rows, the embedder, the threshold
    and the search. Two builds with the same digest find the same matches for the same image (--reuse)."""
    import hashlib

    from dedup.transforms import IndexRows

    index, threshold, _ = loaded
    rows = IndexRows.of(index)
    digest = hashlib.sha256()
    digest.update(repr((embedder_name, tuple(embedder_args), float(threshold), preset.near_duplicate_search,
                        sorted(dedup_options.search_options(preset).items()))).encode())
    digest.update(np.ascontiguousarray(rows.vectors, np.float32).tobytes())
    for column in (rows.keys, rows.set_names, rows.variants):
        digest.update("\n".join(column.tolist()).encode())
    return digest.hexdigest()


def write_eval_index(loaded, output_dir: str, preset) -> EvalIndex:
    """Write the embedded sets and their centroids to ``<output_dir>/near_duplicates/index/``, where the workers read them."""
    from dedup.transforms import IndexRows, index_centroids

    index, threshold, _ = loaded
    planned = eval_index_at(loaded, output_dir)
    write_index(index, planned.directory, index_thumbnails(index))
    centroids = index_centroids(IndexRows.of(index), search_options(preset, threshold))
    _write(FileSystems.join(planned.directory, CENTROIDS_FILE), _npy(centroids))
    return planned


def eval_index_at(loaded, output_dir: str) -> EvalIndex:
    """What the job carries for the index ``write_eval_index`` writes under ``output_dir``: where, not what.

    A dry run (``pipeline.build.dry_run``) builds its graph with this, writing nothing.
    """
    _, threshold, note = loaded
    return EvalIndex(index_directory(output_dir), threshold, note)


def search_options(preset, threshold: float):
    """How the evaluation index is searched: ``dedup.transforms.SearchOptions`` from the preset."""
    from dedup.transforms import SearchOptions

    return SearchOptions(threshold=threshold, search=preset.near_duplicate_search, **dedup_options.search_options(preset))


def load_clustered_index(eval_index: EvalIndex, preset):
    """The index the workers match against: rows and centroids from the files, searched as the preset says."""
    from dedup.transforms import ClusteredIndex

    rows = load_index_rows(eval_index.directory)
    centroids = np.load(io.BytesIO(_read(FileSystems.join(eval_index.directory, CENTROIDS_FILE))), allow_pickle=False)
    return ClusteredIndex(rows, centroids, search_options(preset, eval_index.threshold))


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(np.asarray(array, np.float32)), allow_pickle=False)
    return buffer.getvalue()


def index_thumbnails(index) -> Dict[tuple, str]:
    """(set, key) -> base64 JPEG thumbnail of each evaluation image, for the report."""
    out = {}
    for i in range(len(index.keys)):
        ident = (str(index.set_names[i]), str(index.keys[i]))
        if ident in out:
            continue
        preview = index.thumbnail(i)
        if isinstance(preview, str):
            preview = _read(preview)
        out[ident] = thumbnail_b64(preview) if preview else None
    return out


def index_directory(output_dir: str) -> str:
    return FileSystems.join(output_dir, *INDEX_DIR)


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")


def write_index(index, directory: str, thumbnails: Dict[Tuple[str, str], str]) -> None:
    """The index rows and the images' thumbnails as files; same index, same bytes.

    ``index``: ``vectors [M, D]``, ``keys``, ``set_names``, ``variants`` (an
    ``IndexSet`` or ``dedup.transforms.IndexRows``); ``thumbnails``: (set,
    key) -> base64 JPEG or None, written in its own order.
    """
    vectors = np.ascontiguousarray(np.asarray(index.vectors, np.float32))
    if vectors.ndim != 2 or len(vectors) != len(index.keys):
        raise ValueError(f"index vectors of shape {vectors.shape} for {len(index.keys)} rows")
    _write(FileSystems.join(directory, VECTORS_FILE), _npy(vectors))
    rows = (
        {"set": str(s), "key": str(k), "variant": str(v)}
        for s, k, v in zip(index.set_names, index.keys, index.variants)
    )
    _write(FileSystems.join(directory, ROWS_FILE), _jsonl(rows))
    thumbs = ({"set": s, "key": k, "thumbnail": t} for (s, k), t in thumbnails.items())
    _write(FileSystems.join(directory, THUMBNAILS_FILE), _jsonl(thumbs))


def load_index_rows(directory: str):
    """``write_index``'s files -> ``dedup.transforms.IndexRows`` (what matching needs)."""
    from dedup.transforms import IndexRows

    vectors = np.load(io.BytesIO(_read(FileSystems.join(directory, VECTORS_FILE))), allow_pickle=False)
    rows = [json.loads(line) for line in _read(FileSystems.join(directory, ROWS_FILE)).decode("utf-8").splitlines()]
    if len(rows) != len(vectors):
        raise ValueError(f"{directory}: {len(vectors)} vectors but {len(rows)} rows")
    return IndexRows(
        vectors.reshape(len(rows), -1) if len(rows) else vectors,
        [r["key"] for r in rows],
        [r["set"] for r in rows],
        [r["variant"] for r in rows],
    )


def thumbnail_entry(line: str) -> Tuple[Tuple[str, str], str]:
    """A line of ``thumbnails.jsonl`` -> ``((set, key), base64 JPEG or None)``."""
    row = json.loads(line)
    return (row["set"], row["key"]), row["thumbnail"]


def _with_thumbnail(element):
    _, grouped = element
    thumbnail = next(iter(grouped["thumbnail"]), None)
    for row in grouped["row"]:
        yield dict(row, index_thumbnail=thumbnail)


class AddIndexThumbnails(beam.PTransform):
    """Report rows -> the same rows with ``index_thumbnail`` from ``directory``.

    A keyed join, not a side input: every worker would otherwise hold the
    thumbnails of every evaluation image (about 6 KB each), though only the
    few that matched are needed.
    """

    def __init__(self, directory: str):
        super().__init__()
        self.directory = directory

    def expand(self, rows):
        thumbnails = (
            rows.pipeline
            # Not checked while the graph is built: the launcher writes the file before it runs the job, and
            # a dry run (pipeline.build.dry_run) builds the graph without writing it.
            | "ReadThumbnails" >> beam.io.ReadFromText(  # it takes a pattern: the output's path in it is literal
                FileSystems.join(escape_glob(self.directory), THUMBNAILS_FILE), validate=False)
            | "ParseThumbnails" >> beam.Map(thumbnail_entry)
        )
        keyed = rows | "ByIndexImage" >> beam.Map(lambda row: ((row["index_set"], row["index_key"]), row))
        return (
            {"row": keyed, "thumbnail": thumbnails}
            | "JoinThumbnails" >> beam.CoGroupByKey()
            | "WithThumbnail" >> beam.FlatMap(_with_thumbnail)
        )


class EvalMatchVerdicts(beam.PTransform):
    """Light rows -> ``(key, "near_duplicate_eval/<set>")`` for those the first pass matched to an evaluation image."""

    decides = ("near_duplicate_eval",)

    def __init__(self, eval_index: EvalIndex):
        super().__init__()
        self.notes = {"near_duplicate_eval": eval_index.note}

    def expand(self, rows):
        return (
            rows
            | "Matched" >> beam.Filter(lambda row: bool(row.eval_match))
            | "Verdict" >> beam.Map(lambda row: (row.key, row.eval_match))
        )
