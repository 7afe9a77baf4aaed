"""``common.histogram``: the combiner behind the stats' histograms."""

from common.histogram import HistogramFn


def test_histogram_combine():
    fn = HistogramFn([0, 10, 100])
    acc = fn.create_accumulator()
    for v in [0, 5, 10, 99, 100, 1e9]:
        acc = fn.add_input(acc, v)
    assert fn.extract_output(fn.merge_accumulators([acc, acc]))["counts"] == [4, 4, 4]
