"""``common.schema``: a record's key, split and ledger file are functions of its (url, caption) alone."""

from common import schema
from common.schema import make_key


def test_key_depends_on_url_and_caption_only():
    assert make_key("u", "c") == make_key("u", "c")
    assert make_key("u", "c") != make_key("u", "c ")
    assert make_key("ab", "c") != make_key("a", "bc")


def test_split_and_ledger_file_are_functions_of_the_key():
    keys = [make_key(f"u{i}", "c") for i in range(20_000)]
    fraction = sum(schema.split_of(k, 0.05) == "validation" for k in keys) / len(keys)
    assert 0.04 < fraction < 0.06
    counts = [0] * 8
    for k in keys:
        counts[schema.shard_of(k, 8)] += 1
    assert max(counts) < 1.1 * len(keys) / 8
