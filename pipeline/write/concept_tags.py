"""The optional TOnICS stage of the build: tag written pairs with ontology classes, count them.

    python -m pipeline.build ... --concepts default          # the built-in English ontology
    python -m pipeline.build ... --concepts my_ontology.json [--carry_columns labels --concept_labels_column labels]

Tagging happens where the records are written (``pipeline.write``): it never
rejects, it sets ``Candidate.concepts`` (``filters.concepts.Tagger``), which
the writer turns into the shards' ``concepts`` feature and, per shard, into
``concepts/<shard>.json``: the byte offset of every record of each class, so
that the trainer draws a whole minibatch of one class by seeking, without
scanning the corpus (``trainer.concept_batches``). ``WriteConceptStats``
sums the shards' counts per class and split into ``stats/concepts.json``,
which the console summary and the audit report show. Without ``--concepts``
none of this runs and the build's files are byte-identical to a build
without the stage.
"""

from __future__ import annotations

import json
from typing import Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common import state_files as sf
from common.files import write_text
from common.ontology import Ontology
from common.schema import SPLITS
from pipeline.funnel.stats_files import concepts_schema

STATS_FILE = "stats/concepts.json"
PAIRS, TAGGED = "", "*"  # count keys beside the class names (not valid class names)


def concepts_of(text: str, carried, tagger, labels_column: str = "") -> tuple:
    """The classes a pair names: by its text, and with ``labels_column`` (a carried column of detector
    labels) only those its image's labels contain too."""
    from filters.concepts import parse_labels

    labels = parse_labels(dict(carried).get(labels_column, "")) if labels_column else None
    return tagger.tag(text, labels)


def tag_record(record, tagger, labels_column: str = ""):
    """The record with ``concepts`` set."""
    return record.replace(concepts=concepts_of(record.text, record.carried, tagger, labels_column))


def concept_stats(counts: dict, ontology: Ontology, labels_column: str = "") -> dict:
    """``{(split, key): n}`` counts -> the ``stats/concepts.json`` document."""
    splits = {}
    for split in SPLITS:
        splits[split] = {
            "pairs": counts.get((split, PAIRS), 0),
            "tagged": counts.get((split, TAGGED), 0),
            "per_class": {name: counts.get((split, name), 0) for name in ontology.class_names},
        }
    return {
        "ontology": ontology.source,
        "root": ontology.root,
        "evidence": f"text and image labels (column {labels_column!r})" if labels_column else "text",
        "classes": list(ontology.class_names),
        "splits": splits,
    }


class WriteConceptStats(beam.PTransform):
    """``((split, class), records)`` counts of the written shards -> ``stats/concepts.json``."""

    def __init__(self, output_dir: str, ontology: Ontology, labels_column: str = ""):
        super().__init__()
        self.output_dir = output_dir
        self.ontology = ontology
        self.labels_column = labels_column

    def expand(self, counts):
        path = FileSystems.join(self.output_dir, STATS_FILE)
        ontology, labels_column = self.ontology, self.labels_column
        return (
            counts
            | "SumPerClass" >> beam.CombinePerKey(sum)
            | "CollectCounts" >> beam.combiners.ToDict()
            | "WriteConceptStats" >> beam.Map(
                lambda counts: write_text(path, json.dumps(concept_stats(counts, ontology, labels_column),
                                                           indent=1)))
        )


def summary_line(output_dir: str, top: int = 5) -> Optional[str]:
    """One console line about ``stats/concepts.json`` (None if the build did not tag)."""
    path = FileSystems.join(output_dir, STATS_FILE)
    try:
        stats = sf.read_json(path, concepts_schema)
    except sf.DamagedFile as error:
        return f"concepts: {error}"
    if stats is None:
        return None
    train = stats["splits"].get("train", {"pairs": 0, "tagged": 0, "per_class": {}})
    ranked = sorted(train["per_class"].items(), key=lambda kv: (-kv[1], kv[0]))
    empty = sum(1 for _, n in ranked if n == 0)
    shown = ", ".join(f"{name} {n:,}" for name, n in ranked[:top] if n)
    return (f"concepts ({stats['ontology']}, {len(ranked)} classes): {train['tagged']:,} of {train['pairs']:,} "
            f"train pairs name a class; most: {shown or 'none'}; {empty} classes with no pair")
