"""The build's near-duplicate stage: embed survivors, match them to evaluation sets.

The evaluation sets are read and embedded once, in the launcher (they are
small); the corpus is embedded on the workers in batches, by an embedder
loaded once per worker in ``setup()``. ``dedup.transforms`` does k-means,
the C(10,3) bucket candidates and verification.
"""

from __future__ import annotations

from typing import Dict, List

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from filters.image import thumbnail_b64

NS = "dedup"


class _EmbedBatches(beam.DoFn):
    def __init__(self, embedder_name: str):
        self.embedder_name = embedder_name
        self.embedded = Metrics.counter(NS, "embedded")

    def setup(self):
        from dedup import embedders

        self.embedder = embedders.get(self.embedder_name)

    def process(self, batch):
        keys = [key for key, _ in batch]
        vectors = self.embedder.embed([data for _, data in batch])
        self.embedded.inc(len(keys))
        for key, vector in zip(keys, vectors):
            yield key, np.asarray(vector, np.float32)


class EmbedImages(beam.PTransform):
    """``(key, image bytes)`` -> ``(key, unit vector)``, one row per distinct key."""

    def __init__(self, embedder_name: str, batch_size: int = 64):
        super().__init__()
        self.embedder_name = embedder_name
        self.batch_size = batch_size

    def expand(self, images):
        return (
            images
            # Repeats of one (url, alt-text) pair share a key; embed one of them,
            # chosen by content so that runs agree.
            | "OnePerKey" >> beam.CombinePerKey(min)
            | "Batch" >> beam.BatchElements(min_batch_size=8, max_batch_size=self.batch_size)
            | "Embed" >> beam.ParDo(_EmbedBatches(self.embedder_name))
        )


def resolve_threshold(preset, embedder) -> float:
    """The preset's value if set, else the embedder's own calibrated one."""
    if preset.near_duplicate_threshold > 0:
        return float(preset.near_duplicate_threshold)
    return float(embedder.threshold)


def index_thumbnails(index) -> Dict[tuple, str]:
    """(set, key) -> base64 JPEG thumbnail of each evaluation image, for the report."""
    out = {}
    for i in range(len(index.keys)):
        ident = (str(index.set_names[i]), str(index.keys[i]))
        if ident in out:
            continue
        preview = index.thumbnail(i)
        if isinstance(preview, str):
            from dedup.embedders import read_bytes

            preview = read_bytes(preview)
        out[ident] = thumbnail_b64(preview) if preview else None
    return out


def pair_rows(element, thumbnails: Dict[tuple, str]) -> List[dict]:
    """Join of pairs with the corpus record's rejection -> report rows with both thumbnails."""
    _, grouped = element
    rejections = list(grouped["rejection"])
    corpus_thumb = thumbnail_b64(rejections[0].image) if rejections else None
    rows = []
    for pair in sorted(grouped["pair"], key=lambda p: (-p["cosine"], p["index_set"], p["index_key"])):
        row = dict(pair, cosine=round(float(pair["cosine"]), 6))
        row["thumbnail"] = corpus_thumb
        row["index_thumbnail"] = thumbnails.get((pair["index_set"], pair["index_key"]))
        rows.append(row)
    return rows
