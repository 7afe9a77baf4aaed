"""The audit's what-if: the funnel a build would have given with other thresholds, from its own stats.

    python -m pipeline.audit CORPUS --what_if vocab_size=1000 max_images_per_text=20

reads ``stats/funnel.json`` and ``stats/what_if.json`` (``pipeline.what_if.collect``)
and moves records between the funnel's rows: for each changed rule, every
histogram bin of its measure that the old and the new thresholds decide
differently moves its records from where they ended to where they end now
(the rule, or the bin's class: where the record goes when the rule passes
it, every other threshold as built), first reason winning by the build's
stage order.

Exact, and said to be, when one rule changes, its thresholds fall on the
bins' edges and every record it lets through has a known way. Otherwise an
estimate, with a bound that holds for every figure:

- a threshold inside a bin: the bin's records (placed by the fraction of
  the bin's values the rule keeps);
- records a per-record rule now passes that the build never decoded (their
  way from the full decode on is unknown): placed like the records that
  reached that stage in the build; bound: their number;
- several rules changed at once: a record whose verdict changes under two
  of them may be misplaced; bound: the verdict changes of all the rules
  but the one with the most;
- ``dedup_in_corpus``: a record that moves into or out of the written set
  may change another's in-corpus near-duplicate verdict; bound: the moves.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from common import files
from common.corpus_dir import DamagedFile, parse_json
from filters import presets
from filters.presets import PresetError
from pipeline.what_if import bins, rules
from pipeline.what_if.rules import ABOVE_REACH, FORMAT_VERSION, WHAT_IF_FILE

REMEDY = "rebuild the corpus with this version of pipeline.build to get the what-if's stats"


class WhatIfError(ValueError):
    """A what-if the stats cannot answer, or a malformed assignment; the message is one line."""


def load(stats_dir: str) -> dict:
    path = files.join(stats_dir, WHAT_IF_FILE)
    if not files.exists(path):
        raise WhatIfError(f"no {WHAT_IF_FILE} in {stats_dir}: {REMEDY}")
    doc = parse_json(files.read_bytes(path), path, REMEDY)
    if not isinstance(doc, dict) or doc.get("format_version") != FORMAT_VERSION:
        raise DamagedFile(f"{path}: not a what-if file of format {FORMAT_VERSION}: {REMEDY}")
    try:
        _check(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise DamagedFile(f"{path}: {error}: {REMEDY}") from None
    return doc


def _check(doc: dict) -> None:
    """Every part the what-if reads, of the types it reads them as (a damaged file is one line, not a traceback)."""
    order = doc["order"]
    if not isinstance(order, list) or not isinstance(doc["built"], dict) or not isinstance(doc["caps"], dict):
        raise ValueError("order, built or caps is damaged")
    for stage, classes in doc["rules"].items():
        if stage not in rules.RULES_BY_STAGE:
            raise ValueError(f"unknown rule {stage!r}")
        for cls, pairs in classes.items():
            if cls != rules.WRITTEN and cls.removeprefix(rules.UNKNOWN) not in order:
                raise ValueError(f"unknown class {cls!r} of {stage}")
            bins.from_json(pairs)
    facts = doc.get("rare_ngrams")
    if facts is not None:
        int(facts["reach"]), int(facts["ngrams_at_or_above_reach"]), bins.from_json(facts["count_of_counts"])


def parse_assignments(texts: Sequence[str], built: Mapping) -> Dict[str, object]:
    """``["vocab_size=1000", ...]`` -> ``{param: value}``, each a threshold the what-if answers."""
    changes: Dict[str, object] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not name:
            raise WhatIfError(f"--what_if takes PARAM=VALUE, got {text!r}")
        if name not in rules.RULE_OF_PARAM or name not in built:
            answerable = ", ".join(p for p in rules.RULE_OF_PARAM if p in built)
            raise WhatIfError(f"--what_if cannot change {name!r}; it answers {answerable}")
        param = presets.PARAMS_BY_NAME[name]
        try:
            changes[name] = presets.check_value(param, presets.parse_value(param, value))
        except PresetError as error:
            raise WhatIfError(str(error)) from None
    values = dict(built, **changes)
    if values["min_words"] > values["max_words"]:
        raise WhatIfError(f"min_words: must be at most max_words ({values['max_words']}), got {values['min_words']}")
    return changes


def ngram_cut(doc: dict, values: Mapping) -> int:
    """``filters.ngram_vocab.vocabulary_cut`` from the stored table (the counts below the reach, and how many above)."""
    facts = doc.get("rare_ngrams")
    if not facts:
        raise WhatIfError("the build ran no n-gram vocabulary (vocab_size=0 and min_ngram_count=0): nothing to answer")
    reach, vocab_size, min_count = facts["reach"], values["vocab_size"], values["min_ngram_count"]
    cut = 0
    if vocab_size > 0:
        seen = facts["ngrams_at_or_above_reach"]
        if seen >= vocab_size:
            raise WhatIfError(f"vocab_size={vocab_size}: the vocabulary's cut is above what the build measured "
                              f"(records' n-gram counts below {reach}); the smallest answerable vocab_size is {seen + 1}")
        cut = 1
        for count, n in sorted(facts["count_of_counts"], reverse=True):
            seen += n
            if seen >= vocab_size:
                cut = count
                break
    if min_count > 0:
        if min_count > reach:
            raise WhatIfError(f"min_ngram_count={min_count}: the build measured n-gram counts up to {reach}")
        cut = max(cut, min_count)
    return cut


def rule_conditions(stage: str, values: Mapping, doc: dict) -> List[rules.Condition]:
    if stage == "model_score":
        scored = {cls: bins.from_json(pairs) for cls, pairs in doc["rules"].get(stage, {}).items()}
        if not scored:
            raise WhatIfError("the build scored no pair (no --model_score, or no pair reached the stage): "
                              "nothing to answer")
        return rules.score_conditions(values, scored)
    if stage == "rare_ngrams":
        cut = ngram_cut(doc, values)
        return [(">=", cut)] if cut > 0 else []
    if stage in rules.SHARING_RULES:
        param = "max_" + stage
        cap = doc.get("caps", {}).get(stage)
        if cap is None:
            raise WhatIfError(f"{param}: the build did not run {stage} ({param}=0): nothing to answer")
        if values[param] > cap:
            raise WhatIfError(f"{param}={values[param]}: the build counted {stage} exactly up to {cap}")
    return rules.conditions(stage, values)


def _bin_fraction_kept(grid: bins.Grid, b: int, conds) -> float:
    """The fraction of a split bin's values the rule keeps, the values spread evenly (integers: counted)."""
    low, high = grid.ends(b)
    if grid.integer and high - low < 1 << 20:
        values = range(int(low), int(high) + 1)
        return sum(rules.keeps(conds, v) for v in values) / len(values)
    lo, hi = max(low, -1e12), min(high, 1e12)
    points = [lo + (hi - lo) * (i + 0.5) / 64 for i in range(64)]
    return sum(rules.keeps(conds, v) for v in points) / 64


@dataclasses.dataclass
class WhatIf:
    changes: Dict[str, object]
    built: Dict[str, object]
    order: List[str]
    rejected: Dict[str, int]  # stage -> records it rejects
    written: int
    input: int
    bound: int  # every figure is within this of what a rebuild gives (0: exact)
    bound_parts: Dict[str, int]
    moved: int


def _earliest(stage: str, cls: str, order: Sequence[str]) -> str:
    return stage if rules.position(stage, order) <= rules.position(cls, order) else cls


def _base_counts(funnel: dict) -> Tuple[Dict[str, int], int]:
    rejected = {s["stage"]: sum(s.get("rejected", {}).values()) for s in funnel.get("stages", [])}
    return rejected, sum(funnel.get("written", {}).values())


def _place_unknown(unknown: Dict[str, int], counts: Dict[str, int], base: Dict[str, int], base_written: int,
                   order: Sequence[str]) -> None:
    """Records whose way from stage S on is unknown, placed like the records that reached S in the build."""
    for start, n in unknown.items():
        later = order[order.index(start):]
        weights = [(s, base.get(s, 0)) for s in later] + [(rules.WRITTEN, base_written)]
        total = sum(w for _, w in weights) or 1
        shares = [(s, n * w / total) for s, w in weights]
        placed = {s: math.floor(x) for s, x in shares}
        rest = n - sum(placed.values())
        for s, x in sorted(shares, key=lambda sx: sx[1] - math.floor(sx[1]), reverse=True)[:rest]:
            placed[s] += 1
        for s, k in placed.items():
            counts[s] = counts.get(s, 0) + k


def what_if(doc: dict, funnel: dict, changes: Mapping[str, object]) -> WhatIf:
    built = doc["built"]
    order = doc["order"]
    new = dict(built, **changes)
    changed = sorted({rules.RULE_OF_PARAM[p].stage for p, v in changes.items() if v != built[p]},
                     key=order.index)
    if doc.get("counting_base") != "raw" and any(not rules.RULES_BY_STAGE[s].corpus for s in changed):
        raise WhatIfError("with counting_base=survivors a per-record threshold changes the corpus-wide counts too: "
                          "the what-if answers only the corpus rules' thresholds")
    base, base_written = _base_counts(funnel)
    counts = dict(base, **{rules.WRITTEN: base_written})
    flips: Dict[str, int] = {}
    unknown: Dict[str, int] = {}
    split = moved = 0
    for stage in changed:
        histograms = doc["rules"].get(stage)
        if histograms is None:
            raise WhatIfError(f"the build has no measures for {stage}: it did not run")
        rule = rules.RULES_BY_STAGE[stage]
        old, now = rule_conditions(stage, built, doc), rule_conditions(stage, new, doc)
        for cls, pairs in histograms.items():
            for b, n in pairs:
                if stage == "rare_ngrams" and b == ABOVE_REACH:
                    continue  # no n-gram below the reach: kept by every cut the what-if answers
                kept_old, kept_new = rules.bin_keeps(rule.grid, b, old), rules.bin_keeps(rule.grid, b, now)
                if kept_old == kept_new and kept_old is not None:
                    continue
                fraction_old = _bin_fraction_kept(rule.grid, b, old) if kept_old is None else float(kept_old)
                fraction_new = _bin_fraction_kept(rule.grid, b, now) if kept_new is None else float(kept_new)
                if kept_old is None or kept_new is None:
                    split += n
                changing = round(n * abs(fraction_new - fraction_old))
                flips[stage] = flips.get(stage, 0) + changing
                if not changing:
                    continue
                passed, failed = cls, _earliest(stage, cls, order)
                source, target = (failed, passed) if fraction_new > fraction_old else (passed, failed)
                if source == target:
                    continue
                moved += changing
                counts[source] -= changing
                if target.startswith(rules.UNKNOWN):
                    unknown[target[len(rules.UNKNOWN):]] = unknown.get(target[len(rules.UNKNOWN):], 0) + changing
                else:
                    counts[target] = counts.get(target, 0) + changing
    _place_unknown(unknown, counts, base, base_written, order)
    parts = {
        "thresholds inside a bin": split,
        "records never decoded by the build": sum(unknown.values()),
        "rules changed together": sum(flips.values()) - max(flips.values()) if len(flips) > 1 else 0,
        "in-corpus near-duplicates": moved if doc.get("dedup_in_corpus") else 0,
    }
    written = counts.pop(rules.WRITTEN)
    return WhatIf(dict(changes), dict(built), list(order), counts, written, int(funnel.get("input", 0)),
                  sum(parts.values()), {k: v for k, v in parts.items() if v}, moved)


def format_what_if(result: WhatIf, funnel: dict) -> str:
    """The what-if funnel as a table beside the build's, and what is exact."""
    base, base_written = _base_counts(funnel)
    ran = [s["stage"] for s in funnel.get("stages", []) if s.get("ran", True)]
    changed = ", ".join(f"{p}={presets.format_value(v)} (built {presets.format_value(result.built[p])})"
                        for p, v in result.changes.items())
    lines = [f"what if {changed}:", f" {'stage':<22} {'rejected':>9} {'built':>9} {'change':>8}"]
    for stage in ran:
        now, then = result.rejected.get(stage, 0), base.get(stage, 0)
        lines.append(f" {stage:<22} {now:>9,} {then:>9,} {_signed(now - then):>8}")
    lines.append(f" {'written':<22} {result.written:>9,} {base_written:>9,} {_signed(result.written - base_written):>8}")
    if result.bound == 0:
        lines.append(f"exact: a rebuild with these thresholds gives these figures ({result.moved:,} records move)")
    else:
        why = "; ".join(f"{k} {v:,}" for k, v in result.bound_parts.items())
        lines.append(f"estimate: every figure is within {result.bound:,} of a rebuild's ({why})")
    return "\n".join(lines)


def _signed(n: int) -> str:
    return f"{n:+,}" if n else "0"


def run(stats_dir: str, funnel: Optional[dict], assignments: Sequence[str]) -> int:
    """The ``--what_if`` of ``python -m pipeline.audit``: prints the funnel; 2 with one line when it cannot."""
    if funnel is None:
        return 2
    try:
        doc = load(stats_dir)
        result = what_if(doc, funnel, parse_assignments(assignments, doc["built"]))
    except (WhatIfError, DamagedFile) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_what_if(result, funnel))
    return 0
