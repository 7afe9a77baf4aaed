"""``pipeline.funnel.counts``: the funnel's rows in stage order, and its conservation law."""

import pytest

from pipeline.funnel import counts as stats


def test_funnel_conservation_and_order():
    funnel = stats.build_funnel(10, {"image_size/too_small": 3, "text/empty": 1}, {"train": 5, "validation": 1}, ["image_size"])
    assert funnel["conserved"] and funnel["rejected_total"] == 4
    rows = {row["stage"]: row for row in funnel["stages"]}
    assert rows["image_size"]["in"] == 10 and rows["image_size"]["out"] == 7 and rows["text"]["out"] == 6
    broken = stats.build_funnel(10, {"text/empty": 1}, {"train": 5}, [])
    assert not broken["conserved"]
    with pytest.raises(ValueError):
        stats.build_funnel(1, {"made_up/x": 1}, {}, [])
