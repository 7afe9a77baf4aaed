"""``--set NAME=VALUE`` on a selection: tighter per-record rules re-applied to the table's measures, first reason wins.

The rules the table answers exactly are those whose measure it keeps at
the precision the build compared: ``min_words`` and ``max_words``
(``words``), ``max_word_repetition`` (``repetition``), ``nsfw_threshold``
(``nsfw_score``) and ``model_score_threshold`` (``model_score``). They are
applied, in stage order, to every record the build wrote and to every
repeat of a written pair (``duplicate_pair/repeat``), and of a key's rows
still kept the first by ``pipeline.stages.verdicts.keep_order`` is written,
the others are repeats: what a rebuild with the same ``--set`` decides,
because in such a build nothing else moves (``check_thresholds`` refuses
the builds where something would):

- only tighter values: a looser one lets in records the first pass
  rejected, whose stored picture it never made (a rebuild does that);
- the corpus-wide counts over the raw pool (``counting_base`` ``raw``), which
  per-record rules do not change, no in-corpus near-duplicates and no
  model-score top fraction (both see which records are still in the
  running);
- a score rule only where the build scored (NSFW on, a pair model).
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping

import apache_beam as beam

from common.hot_keys import JoinDecisions
from filters import stages
from filters.nsfw import REJECT_REASON as NSFW_REASON
from filters.nsfw import is_pornographic, stage_enabled
from filters.presets import keep_op, keeps, rule_enabled
from filters.score_cut import BELOW_THRESHOLD
from pipeline.build.options import UsageError
from pipeline.stages.light_rows import LightRow
from pipeline.stages.verdicts import REPEAT, keep_order

#: The rules a selection re-applies, and the table column each compares.
RULES = {"min_words": "words", "max_words": "words", "max_word_repetition": "repetition",
         "nsfw_threshold": "nsfw_score", "model_score_threshold": "model_score"}


def _tighter(name: str, old, new, values: Mapping) -> bool:
    if not rule_enabled(name, values) and new == old:
        return True
    op = keep_op(name, values)
    return new >= old if op in (">=", ">") else new <= old


def check_thresholds(overrides: List[str], old: Mapping, new: Mapping) -> None:
    """One line if a ``--set`` is not a tighter rule the table answers, or the build is one where a rebuild
    would decide otherwise. ``old``/``new``: the build's and the selection's preset values."""
    for item in overrides:
        name = item.split("=", 1)[0].strip()
        if name not in RULES:
            raise UsageError(f"--set {name}: the candidate table cannot answer this rule (a selection re-applies "
                             f"{', '.join(RULES)}); rebuild with it")
        if not _tighter(name, old[name], new[name], new):
            raise UsageError(f"--set {item}: looser than the build's {name}={old[name]}: records the build rejected "
                             "would come in, and their pictures were never made; rebuild with it")
    if new["counting_base"] != "raw" or new["dedup_in_corpus"] or new["model_score_top_fraction"] < 1.0:
        raise UsageError("--set: this build's corpus-wide stages (counting_base survivors, in-corpus near-duplicates "
                         "or a model-score top fraction) see which records the rules keep; rebuild with it")
    names = {item.split("=", 1)[0].strip() for item in overrides}
    if "nsfw_threshold" in names and not stage_enabled(old["nsfw_threshold"]):
        raise UsageError("--set nsfw_threshold: the build did not run the NSFW stage, the table holds no score")
    if "model_score_threshold" in names and old["model_score_threshold"] <= -1.0 and old["model_score_top_fraction"] >= 1:
        raise UsageError("--set model_score_threshold: the build scored no pair (--model_score), the table holds "
                         "no score")


def new_reason(row: LightRow, words: int, repetition: float, values: Mapping) -> str:
    """The first rule (stage order) that rejects ``row`` (with the table's ``words`` and ``repetition``) under
    ``values``; "" if none does."""
    if not keeps(values, "min_words", words):
        return stages.reason("text_length", "too_few_words")
    if not keeps(values, "max_words", words):
        return stages.reason("text_length", "too_many_words")
    if words and not keeps(values, "max_word_repetition", repetition):
        return stages.reason("text_repetition", "repetitive")
    if row.nsfw_score != -math.inf and is_pornographic(row.nsfw_score, values["nsfw_threshold"]):
        return NSFW_REASON
    if row.model_score != -math.inf and not keeps(values, "model_score_threshold", row.model_score):
        return BELOW_THRESHOLD
    return ""


def judged(measured, values: Mapping) -> LightRow:
    """``(row, words, repetition)`` -> the row, with its new reason if a rule now rejects it."""
    row, words, repetition = measured
    reason = new_reason(row, words, repetition, values)
    return row._replace(reason=reason) if reason else row


def _first_kept(rows):
    return min(rows, key=keep_order)


def _fate(row_chosen) -> LightRow:
    row, chosen = row_chosen
    if row.reason:
        return row
    return row if chosen is not None and (chosen.source, chosen.ordinal) == (row.source, row.ordinal) else (
        row._replace(reason=REPEAT))


class ApplyThresholds(beam.PTransform):
    """``(light row, words, repetition)`` of the written records and their repeats -> each row with its new fate
    (reason "" for the one row of a key written)."""

    def __init__(self, values: Dict):
        super().__init__()
        self.values = dict(values)

    def expand(self, measured):
        rows = measured | "Judge" >> beam.Map(judged, self.values)
        chosen = (
            rows
            | "StillKept" >> beam.Filter(lambda row: not row.reason)
            | "KeyKept" >> beam.Map(lambda row: (row.key, row))
            | "FirstKeptPerKey" >> beam.CombinePerKey(_first_kept)
        )
        return (
            {"rows": rows | "KeyRows" >> beam.Map(lambda row: (row.key, row)), "decisions": chosen}
            | "JoinChosen" >> JoinDecisions(combine=_first_kept, label="select_thresholds")
            | "Fate" >> beam.Map(_fate)
        )


def apply_to_rows(measured: List[tuple], values: Mapping) -> List[LightRow]:
    """The same rule on a list (tests): of each key's rows the rules still keep, the first by ``keep_order``."""
    rows = [judged(m, values) for m in measured]
    first: Dict[str, LightRow] = {}
    for row in rows:
        if not row.reason and (row.key not in first or keep_order(row) < keep_order(first[row.key])):
            first[row.key] = row
    return [_fate((row, first.get(row.key))) for row in rows]
