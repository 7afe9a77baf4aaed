"""common.hot_keys.JoinDecisions: a plain join's result, with no key's rows in one list."""

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from common import hot_keys


def run_join(rows, decisions, max_rows, label="t"):
    p = beam.Pipeline(runner=FnApiRunner())
    joined = {"rows": p | "Rows" >> beam.Create(rows), "decisions": p | "Decisions" >> beam.Create(decisions)} | (
        hot_keys.JoinDecisions(max_rows, label=label))
    return p, joined


def metrics(result):
    queried = result.metrics().query(MetricsFilter().with_namespace(hot_keys.NAMESPACE))
    return ({c.key.metric.name: c.committed for c in queried["counters"]},
            {d.key.metric.name: d.committed for d in queried["distributions"]})


def test_hot_keys_are_decided_by_side_input_and_the_rest_grouped_in_small_lists():
    rows = [("hot", f"h{i}") for i in range(50)] + [("a", "a0"), ("a", "a1"), ("b", "b0")]
    rows += [("cold", f"c{i}") for i in range(10)]  # exactly max_rows: still grouped
    decisions = [("hot", "X"), ("a", "Z"), ("a", "Y"), ("nobody", "W")]
    expected = [(r, "X") for _, r in rows[:50]] + [("a0", "Y"), ("a1", "Y"), ("b0", None)]
    expected += [(f"c{i}", None) for i in range(10)]
    p, joined = run_join(rows, decisions, max_rows=10)
    assert_that(joined, equal_to(expected))
    counters, distributions = metrics(p.run())
    assert counters["t/hot_rows"] == 50
    grouped = distributions["t/grouped_rows"]
    assert grouped.max == 10 and grouped.sum == 13  # "cold", "a", "b"; never "hot"


def test_without_hot_keys_it_is_a_plain_join():
    rows = [(k, f"{k}{i}") for k in "abc" for i in range(3)]
    p, joined = run_join(rows, [("b", 1), ("b", 0)], max_rows=3)
    assert_that(joined, equal_to([(r, 0 if r.startswith("b") else None) for _, r in rows]))
    counters, _ = metrics(p.run())
    assert counters.get("t/hot_rows", 0) == 0


def test_a_hot_key_without_a_decision_is_decided_none_by_side_input():
    rows = [("hot", f"h{i}") for i in range(20)] + [("a", "a0")]
    p, joined = run_join(rows, [("a", "Z")], max_rows=5)
    assert_that(joined, equal_to([(r, None) for _, r in rows[:20]] + [("a0", "Z")]))
    counters, distributions = metrics(p.run())
    assert counters["t/hot_rows"] == 20 and distributions["t/grouped_rows"].max == 1  # "hot" was never grouped
