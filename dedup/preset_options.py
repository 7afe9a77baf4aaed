"""The preset's near-duplicate parameters as ``dedup`` takes them.

The presets hold numbers (``filters.presets``); ``dedup.transforms`` takes
``SearchOptions`` and a cosine threshold. This is the one place that
translates between them, for both near-duplicate stages.
"""

from __future__ import annotations


def embedder(name: str, args=()):
    """The image embedder called ``name`` with constructor ``args`` (``(key, value)`` pairs,
    ``--embedder_arg``; ``dedup.embedders``, imported only when asked for)."""
    from dedup import embedders

    return embedders.get(name, **dict(args))


def resolve_threshold(preset, embedder) -> float:
    """The preset's value if set, else the embedder's own calibrated one."""
    if preset.near_duplicate_threshold > 0:
        return float(preset.near_duplicate_threshold)
    return float(embedder.threshold)


def search_options(preset) -> dict:
    """``dedup.transforms.SearchOptions`` from the preset, but ``search`` (eval and in-corpus differ)."""
    return dict(
        num_clusters=preset.num_clusters,
        nearest_clusters=preset.nearest_clusters,
        bucket_size=preset.bucket_size,
        sample_size=preset.kmeans_sample_size,
        centroid_merge_cosine=preset.centroid_merge_cosine,
    )
