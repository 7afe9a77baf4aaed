"""``pipeline.write.shards``: shards hold at most the bound and are numbered in the order of their files."""

from pipeline.write import shards


def test_shards_hold_at_most_the_bound_and_are_numbered_over_files_in_path_order():
    assert shards.chunk_sizes(2000, 2000) == [2000] and shards.chunk_sizes(2001, 2000) == [1001, 1000]
    assert shards.chunk_sizes(7, 3) == [3, 2, 2] and shards.chunk_sizes(0, 5) == []
    firsts, totals = shards.shard_plan([("b.parquet", "train", 5), ("a.parquet", "train", 2001),
                                        ("b.parquet", "validation", 1), ("c.parquet", "train", 1)], 2000)
    assert firsts == {"a.parquet": {"train": 0}, "b.parquet": {"train": 2, "validation": 0}, "c.parquet": {"train": 3}}
    assert totals == {"train": 4, "validation": 1}
