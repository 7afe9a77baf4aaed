"""``WhatIfStats``: the histograms the audit's what-if answers from, written to ``stats/what_if.json``.

For every rule of ``pipeline.what_if.rules`` it counts the records by
(class, bin of the measure): the class is where the record ends if the rule
passes it, every other threshold as built. Three sources, all on light rows:

- the keys' fates (``verdicts.KeyFate``: rows still in the running, every
  key stage that gave the key a verdict, its lowest n-gram count): the
  cheap per-record rules and NSFW (which these rows passed: their class is
  their fate), ``rare_ngrams`` (the lowest count; none below the reach is the
  ``ABOVE_REACH`` bin), ``model_score`` (the row's cosine, when the build
  scored it) and the sharing rules;
- for the sharing rules, the key's group (its image, its alt-text) meets
  the group's distinct count (``filters.frequency.DropSharedGroups``'s
  ``counts``, kept for the groups of two members or more) in a
  ``CoGroupByKey`` of per-group class counts, never of rows;
- the per-record rejections of the cheap rules and the stages after them
  (with ``counting_base="raw"``, their alt-text normalised and their size
  known): the cheap rules and NSFW, the rejecting rule's class being the
  next cheap rule its measures fail, or ``?S`` from the first stage it never
  reached that the light row cannot replay (the full decode; after NSFW,
  the stage that follows it).

All of it is combined on the workers (sparse ``{bin: count}`` histograms,
combiner-lifted); the one file is written from the combined result, like
the other stats.
"""

from __future__ import annotations

import json
import math
from typing import Dict, Iterable, Mapping, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from common import state_files as sf
from common.once import once, total
from filters import presets, stages
from filters.frequency import image_identity, pool_row, stages_run, what_if_cap
from filters.ngram_vocab import vocabulary_enabled
from filters.text import text_identity
from pipeline.what_if import bins, rules
from pipeline.what_if.rules import ABOVE_REACH, FORMAT_VERSION, WHAT_IF_FILE


def built_conditions(values: Mapping) -> Dict[str, list]:
    return {stage: rules.conditions(stage, values) for stage in rules.CHEAP_STAGES}


def _fate_classes(names: Sequence[str]):
    """(class of the key's first row, class of each repeat) as built."""
    if names:
        return names[0], names[0]
    return rules.WRITTEN, rules.DUPLICATE


def key_contributions(fate_kv, order: Sequence[str], rank: Mapping[str, int], rare: bool):
    """A key's fate -> ``(rule, class, bin, n)`` for the cheap rules, ``rare_ngrams`` and, for a scored pair,
    ``model_score`` (its cosine)."""
    _, (count, first, _, _, _, mask, lowest) = fate_kv
    if count == 0:
        return  # every row of the key was rejected by a per-record stage: counted from those rows
    names = [name for name in order if mask >> rank[name] & 1]
    fate_first, fate_repeat = _fate_classes(names)
    measures = rules.record_measures(first)
    for stage in rules.MEASURED_STAGES:
        if stage in measures:
            b = rules.RULES_BY_STAGE[stage].grid.bin(measures[stage])
            yield stage, fate_first, b, 1
            if count > 1:
                yield stage, fate_repeat, b, count - 1
    if rare:
        c_first, c_repeat = rules.classes_of_key(names, "rare_ngrams")
        b = rules.NGRAM_COUNTS.bin(lowest) if lowest else ABOVE_REACH
        yield "rare_ngrams", c_first, b, 1
        if count > 1:
            yield "rare_ngrams", c_repeat, b, count - 1
    if math.isfinite(first.model_score):  # scored: the build ran the model-score stage and the row reached it
        c_first, c_repeat = rules.classes_of_key(names, "model_score")
        b = rules.COSINES.bin(first.model_score)
        yield "model_score", c_first, b, 1
        if count > 1:
            yield "model_score", c_repeat, b, count - 1


def key_groups(fate_kv, order: Sequence[str], rank: Mapping[str, int], identity: str, sharing: Iterable[str]):
    """A key's fate -> ``((rule, group), {class: n})`` for each sharing rule the build ran."""
    _, (count, first, _, _, _, mask, _) = fate_kv
    if count == 0:
        return
    names = [name for name in order if mask >> rank[name] & 1]
    for stage in sharing:
        c_first, c_repeat = rules.classes_of_key(names, stage)
        if stage == "texts_per_image":
            group = image_identity(pool_row(first), identity)
        else:
            group = text_identity(first.text)
        classes = {c_first: 1}
        if count > 1:
            classes[c_repeat] = classes.get(c_repeat, 0) + count - 1
        yield (stage, group), classes


def _sum_dicts(dicts):
    out: Dict[str, int] = {}
    for d in dicts:
        for k, n in d.items():
            out[k] = out.get(k, 0) + n
    return out


def _group_contributions(joined):
    (stage, _), sides = joined
    counts = list(sides["count"])
    count = counts[0] if counts else 1  # a group absent from the shared counts has one member: this key
    b = rules.GROUP_COUNTS.bin(count)
    for classes in sides["classes"]:
        for cls, n in classes.items():
            yield stage, cls, b, n


def text_stage_passes(text: str, values: Mapping) -> bool:
    """The ``text`` stage on a normalised alt-text (``filters.text.check_text``'s first rules)."""
    return bool(text) and "\ufffd" not in text and len(text) <= values["max_chars"]


def rejection_contributions(row, order: Sequence[str], values: Mapping, built: Mapping[str, list]):
    """A per-record rejection -> ``(rule, class, bin, 1)`` for the cheap rules whose measures it has.

    Under ``counting_base="raw"`` a row that a cheap rule rejected is in the
    counting pool, its alt-text normalised, unless that alt-text fails the
    ``text`` stage: then only its image measures are known, and ``text`` is
    where it goes next. A row the ``text`` stage rejected has only its image
    measures too: a stricter image rule would reject it first.
    """
    stage = stages.stage_of(row.reason)
    if values["counting_base"] != "raw" or stage in rules.FIXED_FIRST_PASS or stage not in order:
        return  # no threshold of the what-if moves it, or its measures are not on the row
    measures = rules.record_measures(row)
    text_passes = bool(row.counted) and text_stage_passes(row.text, values)
    if not row.counted:
        if stage not in ("image_size", "image_aspect", "text"):
            return
        measures = {rule: value for rule, value in measures.items() if rule in ("image_size", "image_aspect")}
    for rule in rules.MEASURED_STAGES:
        if rule not in measures or rule not in order:
            continue
        if rule == stage:
            cls = rules.next_failing(stage, measures, built, order, text_passes=text_passes)
        else:
            cls = stage  # a rule before it passed it; one after it never decides while it rejects
        yield rule, cls, rules.RULES_BY_STAGE[rule].grid.bin(measures[rule]), 1


class ClassHistogramsFn(beam.CombineFn):
    """``(rule, class, bin, n)`` -> ``{rule: {class: {bin: n}}}``."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, item):
        rule, cls, b, n = item
        bins.add(acc.setdefault(rule, {}), cls, b, n)
        return acc

    def merge_accumulators(self, accs):
        merged = {}
        for acc in accs:
            bins.merge_into(merged, acc)
        return merged

    def extract_output(self, acc):
        return acc


def what_if_document(histograms, vocabulary, preset, order: Sequence[str], sharing: Sequence[str]) -> dict:
    """The JSON of ``stats/what_if.json``."""
    values = preset.as_dict()
    doc = {
        "format_version": FORMAT_VERSION,
        "order": list(order),
        "built": {param: values[param] for rule in rules.RULES for param in rule.params if param in values},
        "counting_base": values["counting_base"],
        "dedup_in_corpus": bool(values["dedup_in_corpus"]),
        "caps": {stage: what_if_cap("max_" + stage, values["max_" + stage]) for stage in sharing},
        "rules": {
            stage: {cls: bins.to_json(hist) for cls, hist in sorted(classes.items())}
            for stage, classes in sorted(histograms.items())
        },
    }
    if vocabulary and not vocabulary.get("disabled"):
        coc = vocabulary["count_of_counts"]
        reach = vocabulary["reach"]
        # The cut of any vocabulary the what-if answers is below the reach: the counts above it only add up.
        doc["rare_ngrams"] = {
            "cut": vocabulary["cut"], "reach": reach,
            "ngrams_at_or_above_reach": sum(n for c, n in coc.items() if c >= reach),
            "count_of_counts": [[c, n] for c, n in sorted(coc.items()) if c < reach],
        }
    return doc


def _bin(stage: str, b, where: str) -> int:
    """A bin of the rule's grid (``pipeline.what_if.bins``): -1 up to the bin above the last edge."""
    if stage == "rare_ngrams" and b == ABOVE_REACH:
        return b
    return sf.whole(b, where, bins.UNDER, 2 * len(rules.RULES_BY_STAGE[stage].grid.edges) - 1)


def _histogram(stage: str, pairs, where: str) -> None:
    for i, pair in enumerate(sf.array(pairs, where, max_len=1 << 20)):
        if not isinstance(pair, list) or len(pair) != 2:
            raise sf.Problem(f"{where}[{i}]: {sf.shown(pair)}, not a [bin, count] pair")
        _bin(stage, pair[0], f"{where}[{i}] bin")
        sf.whole(pair[1], f"{where}[{i}] count")


def what_if_schema(doc) -> dict:
    """Every part of ``stats/what_if.json`` the what-if reads, of the types and ranges it reads them in.

    Bins must lie on their rule's grid, counts be whole numbers, the built
    thresholds be values of their parameters (``filters.presets``), the
    caps within what the build counts exactly: a damaged file is one line
    (``common.state_files``), never a wrong answer or a traceback.
    """
    sf.obj(doc)
    if doc.get("format_version") != FORMAT_VERSION:
        raise sf.Problem(f"format_version: {sf.shown(doc.get('format_version'))}, not {FORMAT_VERSION} "
                         "(not a what-if file of this version)")
    order = sf.array(sf.field(doc, "order"), "order", max_len=1_000)
    for i, name in enumerate(order):
        sf.text(name, f"order[{i}]")
    missing = [rule.stage for rule in rules.RULES if rule.stage not in order]
    if missing:
        raise sf.Problem(f"order: no {', '.join(missing)}")
    built = sf.obj(sf.field(doc, "built"), "built")
    for param in rules.RULE_OF_PARAM:
        try:
            presets.check_value(presets.PARAMS_BY_NAME[param], sf.field(built, param, "built"))
        except presets.PresetError as error:
            raise sf.Problem(f"built.{error}") from None
    sf.mapping(sf.field(doc, "caps"), "caps", lambda v, w: sf.whole(v, w, 1, rules.GROUP_COUNTS.edges[-1]))
    unknown = sorted(set(doc["caps"]) - set(rules.SHARING_RULES))
    if unknown:
        raise sf.Problem(f"caps: unknown rule {unknown[0]!r}")
    sf.optional(doc, "counting_base", sf.text)
    sf.optional(doc, "dedup_in_corpus", sf.flag)
    for stage, classes in sf.obj(sf.field(doc, "rules"), "rules").items():
        if stage not in rules.RULES_BY_STAGE:
            raise sf.Problem(f"rules: unknown rule {stage[:40]!r}")
        for cls, pairs in sf.obj(classes, f"rules.{stage}").items():
            if cls != rules.WRITTEN and cls.removeprefix(rules.UNKNOWN) not in order:
                raise sf.Problem(f"rules.{stage}: unknown class {cls[:40]!r}")
            _histogram(stage, pairs, f"rules.{stage}.{cls}")
    facts = doc.get("rare_ngrams")
    if facts is not None:
        sf.obj(facts, "rare_ngrams")
        reach = sf.whole(sf.field(facts, "reach", "rare_ngrams"), "rare_ngrams.reach", 1, 1 << 50)
        sf.whole(sf.field(facts, "ngrams_at_or_above_reach", "rare_ngrams"), "rare_ngrams.ngrams_at_or_above_reach")
        sf.optional(facts, "cut", sf.whole, "rare_ngrams")
        table = sf.array(sf.field(facts, "count_of_counts", "rare_ngrams"), "rare_ngrams.count_of_counts", 1 << 20)
        for i, pair in enumerate(table):
            where = f"rare_ngrams.count_of_counts[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise sf.Problem(f"{where}: {sf.shown(pair)}, not a [count, n-grams] pair")
            sf.whole(pair[0], where, 1, reach - 1)
            sf.whole(pair[1], where)
    return doc


def _write(histograms, output_dir, vocabulary, preset, order, sharing):
    doc = what_if_document(histograms, dict(vocabulary).get("rare_ngrams"), preset, order, sharing)
    path = FileSystems.join(output_dir, "stats", WHAT_IF_FILE)
    with FileSystems.create(path) as f:
        f.write(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


class WhatIfStats(beam.PTransform):
    """``{"fates", "record_rejections", "group_counts", "vocabulary"}`` -> ``stats/what_if.json`` under ``output_dir``.

    ``order`` is the run order of the stages the build ran (``ran`` first
    reason wins by), ``rank`` the stage ranks ``KeyFate`` set its bits by.
    """

    def __init__(self, output_dir: str, preset, order: Sequence[str], rank: Mapping[str, int]):
        super().__init__()
        self.output_dir = output_dir
        self.preset = preset
        self.order = tuple(order)
        self.rank = dict(rank)
        run = stages_run(preset)
        self.sharing = tuple(stage for stage in rules.SHARING_RULES if stage in run)
        self.rare = vocabulary_enabled(preset)

    def expand(self, inputs):
        values = self.preset.as_dict()
        built = built_conditions(values)
        fates = inputs["fates"]
        from_keys = fates | "KeyMeasures" >> beam.FlatMap(key_contributions, self.order, self.rank, self.rare)
        from_rejections = inputs["record_rejections"] | "RejectionMeasures" >> beam.FlatMap(
            rejection_contributions, self.order, values, built)
        parts = [from_keys, from_rejections]
        if self.sharing:
            classes = (
                fates
                | "KeyGroups" >> beam.FlatMap(key_groups, self.order, self.rank, self.preset.image_identity,
                                              self.sharing)
                | "ClassesPerGroup" >> beam.CombinePerKey(_sum_dicts))
            parts.append(
                {"classes": classes, "count": inputs["group_counts"]}
                | "JoinGroupCounts" >> beam.CoGroupByKey()
                | "GroupMeasures" >> beam.FlatMap(_group_contributions))
        histograms = total(parts | "AllMeasures" >> beam.Flatten(), "Histograms", ClassHistogramsFn())
        vocabulary = beam.pvalue.AsList(inputs["vocabulary"])
        return once(fates.pipeline, "WriteWhatIf", _write, histograms, self.output_dir, vocabulary, self.preset,
                    self.order, self.sharing)
