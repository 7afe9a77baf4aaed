"""The what-if of ``nsfw_threshold`` against real rebuilds scored by the real model (open_nsfw).

Six small gradient pictures (four distinct) score between 0.03 and 0.05: a cut at 0.036 rejects five of the
six records. Lowering the cut is exact (the kept records' scores are known); raising it back is an estimate (a
record the stage rejected was judged no further), within the bound it states.
"""

import json
import math

import pytest

from corpus_paths import committed
from filters import stages
from pipeline.build import launcher
from pipeline.stages.light_rows import LightRow
from pipeline.what_if import collect, rules
from tests.pipeline.build.test_build_safety import write_candidates
from tests.pipeline.what_if.test_what_if import predicted, stage_counts

# fp32: the cuts below sit between these pictures' fp32 scores, which every CPU computes alike (int8's own
# what-if is exact too: tests/filters/test_open_nsfw_int8.py).
QUICK = ["--set", "vocab_size=0", "--set", "min_shorter_side=0", "--set", "nsfw_precision=fp32"]


def build(root, name, *sets):
    extra = [arg for value in sets for arg in ("--set", value)]
    funnel = launcher.run(["--input", str(root / "in" / "*.parquet"), "--output", str(root / name), *QUICK, *extra])
    return committed(root / name), funnel


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("what_if_nsfw")
    write_candidates(root / "in", rows=6)
    return {"default": build(root, "default"), "strict": build(root, "strict", "nsfw_threshold=0.036")}


def test_a_stricter_cut_is_exact(builds):
    output, funnel = builds["default"]
    counts, result = predicted(output, ["nsfw_threshold=0.036"])
    assert result.bound == 0, result.bound_parts
    assert counts == stage_counts(builds["strict"][1])
    assert counts["nsfw"] == 5 and counts != stage_counts(funnel)
    ledger = [json.loads(line) for path in sorted((builds["strict"][0] / "stats" / "rejected").glob("*.jsonl"))
              for line in path.read_text().splitlines()]
    scores = [line["nsfw_score"] for line in ledger if line["reason"] == "nsfw/pornographic"]
    assert len(scores) == 5 and all(0.036 <= s < 0.05 for s in scores)  # the ledger keeps each rejection's score


def test_a_looser_cut_is_within_its_bound(builds):
    output, funnel = builds["strict"]
    counts, result = predicted(output, ["nsfw_threshold=0.5"])
    actual = stage_counts(builds["default"][1])
    assert counts["nsfw"] == 0 and sum(counts.values()) == funnel["input"]
    assert result.bound_parts.get("records never decoded by the build") == 5
    off = {stage: counts[stage] - actual.get(stage, 0) for stage in counts if counts[stage] != actual.get(stage, 0)}
    assert max(map(abs, off.values()), default=0) <= result.bound, (off, result.bound_parts)


def light(reason="", score=-math.inf, text="a small test picture"):
    return LightRow(key="k", url="u", text=text, reason=reason, counted=True, sha256="s", phash="", width=300,
                    height=200, format="JPEG", source="", reader="", ordinal=0, nsfw_score=score)


def test_a_rejection_by_the_stage_goes_to_the_unknown_after_it():
    order = [s for s in stages.STAGE_NAMES if s not in ("download", "model_score")]
    values = {"counting_base": "raw", "max_chars": 1000, "min_shorter_side": 200, "min_both_sides": 0,
              "max_aspect_ratio": 3.0, "max_aspect_ratio_inclusive": False, "min_words": 3, "max_words": 20,
              "max_word_repetition": 0.5}
    built = {stage: rules.conditions(stage, values) for stage in rules.CHEAP_STAGES}
    found = list(collect.rejection_contributions(light("nsfw/pornographic", 0.93), order, values, built))
    assert ("nsfw", "?texts_per_image", rules.SCORES.bin(0.93), 1) in found
    assert {cls for rule, cls, _, _ in found if rule != "nsfw"} == {"nsfw"}  # the cheap rules before it passed it
    assert rules.record_measures(light("nsfw/undecodable"))["nsfw"] == math.inf  # cut by any threshold
    assert "nsfw" not in rules.record_measures(light())  # never scored: no measure
