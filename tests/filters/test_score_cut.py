"""The model-score stage's rule (``filters.score_cut``): the top fraction found digit by digit equals a sort."""

import math
import random

import numpy as np
import pytest

from filters import score_cut as sc
from filters.presets import PresetError, get_preset


def _scores(rng, n):
    """Cosines with many ties (a few repeated values) and float32 neighbours."""
    repeated = [0.1, 0.2, float(np.float32(0.2) + np.float32(1e-7)), -0.5, 0.9]
    return [rng.choice(repeated) if rng.random() < 0.4 else float(np.float32(rng.uniform(-1, 1))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(8))
def test_the_cut_keeps_round_fraction_times_n_the_highest_by_score_then_key(seed):
    rng = random.Random(seed)
    for _ in range(40):
        n = rng.randrange(0, 300)
        scores, keys = _scores(rng, n), [f"key{i}-{seed}" for i in range(n)]
        fraction = rng.choice([0.0, 0.05, 0.3, 0.5, 0.999, 1.0, rng.random()])
        orders = [sc.order_key(s, k) for s, k in zip(scores, keys)]
        cut = sc.top_fraction_cut(orders, fraction)
        kept = sorted(i for i, o in enumerate(orders) if o >= cut)
        # The reference: sort by (score, key hash), keep the top round(f * n), halves up.
        want = math.floor(fraction * n + 0.5)
        ranked = sorted(range(n), key=lambda i: (scores[i], sc.key_hash(keys[i])))
        assert kept == sorted(ranked[n - want:]), (n, fraction)
        rule = sc.Cut(None, cut)
        assert [rule.reason(scores[i], keys[i]) is None for i in range(n)] == [i in set(kept) for i in range(n)]


def test_order_keys_follow_the_score_and_break_ties_by_key():
    values = sorted(float(np.float32(v)) for v in np.random.default_rng(0).uniform(-1, 1, 5000))
    fixed = [sc.fixed_point(v) for v in values]
    assert fixed == sorted(fixed) and len(set(fixed)) == len(set(values))  # distinct float32 cosines stay distinct
    assert sc.fixed_point(-3.0) == 0 and sc.fixed_point(1.0) == 2**32 - 1
    assert sc.order_key(0.5, "a") >> 32 == sc.order_key(0.5, "b") >> 32 != sc.order_key(0.5000001, "a") >> 32
    assert sc.order_key(0.5, "a") != sc.order_key(0.5, "b")
    assert abs(sc.score_of(sc.order_key(0.25, "x")) - 0.25) < 1e-9


def test_kept_count_rounds_halves_up_and_stays_in_range():
    assert [sc.kept_count(n, 0.5) for n in (0, 1, 2, 3, 5)] == [0, 1, 1, 2, 3]  # round() would give 0 and 2 for 1 and 5
    assert sc.kept_count(10, 0.3) == 3 and sc.kept_count(7, 1.0) == 7 and sc.kept_count(7, 0.0) == 0


def test_a_step_whose_counts_do_not_hold_the_rank_says_so():
    search = sc.start(10, 0.5)
    with pytest.raises(ValueError, match="counts changed"):
        sc.choose_digit(search, {3: 2})


def test_the_threshold_is_kept_inclusive_and_said_before_the_fraction():
    rule = sc.Cut(0.2, sc.order_key(0.5, "m"))
    assert rule.reason(0.2, "k") == sc.OUTSIDE_TOP_FRACTION  # at the threshold: kept by it, cut by the fraction
    assert rule.reason(0.19, "k") == sc.BELOW_THRESHOLD      # cut by both: the threshold is said
    assert rule.reason(0.7, "k") is None
    assert rule.reason(float("nan"), "k") == sc.UNDECODABLE
    assert sc.Cut(0.2).reason(0.2, "k") is None and sc.Cut(None).reason(-1.0, "k") is None
    assert sc.Cut(0.2, sc.order_key(0.5, "m")).lowest_kept() == pytest.approx(0.5, abs=1e-9)
    assert sc.Cut(None).lowest_kept() is None


def test_the_preset_cuts_are_off_by_default_and_checked():
    assert sc.cut_values(get_preset("align")) == (None, None)
    assert sc.cut_values(get_preset("cc12m")) == (None, None)
    assert sc.cut_values(get_preset("align", ["model_score_threshold=0.1", "model_score_top_fraction=0.3"])) == (0.1, 0.3)
    with pytest.raises(PresetError, match=r"^model_score_top_fraction: must be a number in \[0, 1\], got 1.5$"):
        get_preset("align", ["model_score_top_fraction=1.5"])
    with pytest.raises(PresetError, match=r"^model_score_threshold: must be a number in \[-1, 1\]"):
        get_preset("align", ["model_score_threshold=2"])


EDGES = [round(-1.0 + 0.05 * i, 2) for i in range(40)]  # the stage's histogram (score_verdicts.SCORE_EDGES)


def _histogram(**counts_at):
    counts = [0] * len(EDGES)
    for edge, count in counts_at.items():
        counts[EDGES.index(float(edge.replace("m", "-").replace("_", ".")))] = count
    return {"edges": EDGES, "counts": counts}


def test_otsu_splits_two_modes_in_the_middle_of_the_gap():
    two_modes = _histogram(m0_05=30, **{"0_0": 60, "0_05": 40}, **{"0_35": 100, "0_4": 200, "0_45": 90})
    assert sc.otsu_threshold(two_modes) == 0.2  # the edges 0.10-0.35 of the gap tie: the lower middle one
    # Brute force over every edge: the same cut maximises w0 * w1 * (mean0 - mean1)^2.
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.normal(0.0, 0.08, 300), rng.normal(0.45, 0.1, 900)])
    counts = [int(((scores >= lo) & (scores < hi)).sum()) for lo, hi in zip(EDGES, EDGES[1:] + [9.0])]
    centres = np.array(EDGES) + 0.025
    def between(i):
        w0, w1 = sum(counts[:i]), sum(counts[i:])
        if not w0 or not w1:
            return -1
        m0 = np.dot(counts[:i], centres[:i]) / w0
        m1 = np.dot(counts[i:], centres[i:]) / w1
        return w0 * w1 * (m0 - m1) ** 2
    best = max(range(1, len(EDGES)), key=between)
    assert sc.otsu_threshold({"edges": EDGES, "counts": counts}) == EDGES[best]
    assert 0.1 <= EDGES[best] <= 0.3


def test_otsu_needs_two_bins_with_pairs():
    with pytest.raises(ValueError, match="empty histogram"):
        sc.otsu_threshold(_histogram())
    with pytest.raises(ValueError, match="one bin"):
        sc.otsu_threshold(_histogram(**{"0_3": 5}))
