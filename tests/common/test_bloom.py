"""The key set of a semi-join: exact while small, a Bloom filter when large; never a false negative."""

import random

from common.bloom import BloomFilter, KeysOf


def combined(keys, exact_limit, parts=7, seed=0):
    """``KeysOf`` as a runner may run it: partial accumulators, merged in any order."""
    fn = KeysOf(exact_limit)
    rng = random.Random(seed)
    keys = list(keys)
    rng.shuffle(keys)
    accs = [fn.create_accumulator() for _ in range(parts)]
    for i, key in enumerate(keys):
        accs[i % parts] = fn.add_input(accs[i % parts], key)
    rng.shuffle(accs)
    return fn.extract_output(fn.merge_accumulators(accs))


def test_a_small_set_is_exact():
    keys = {f"caption {i}" for i in range(100)}
    found = combined(keys, exact_limit=1000)
    assert isinstance(found, frozenset) and found == keys


def test_a_large_set_has_every_key_and_few_others():
    keys = [f"image-{i}" for i in range(20_000)]
    found = combined(keys, exact_limit=500)
    assert isinstance(found, BloomFilter)
    assert all(key in found for key in keys)  # no false negative, ever
    others = [f"other-{i}" for i in range(20_000)]
    assert sum(key in found for key in others) < 20  # 2^23 bits, 5 hashes: ~1e-6 at 20k keys


def test_merging_a_set_into_a_filter_keeps_both():
    fn = KeysOf(exact_limit=3)
    big = fn.create_accumulator()
    for key in "abcdef":
        big = fn.add_input(big, key)
    small = fn.add_input(fn.create_accumulator(), "z")
    merged = fn.extract_output(fn.merge_accumulators([small, big]))
    assert all(key in merged for key in "abcdefz")
