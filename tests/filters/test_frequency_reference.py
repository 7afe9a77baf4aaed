"""The Beam frequency filters agree record for record with the simple reference.

Corpora come from ``corpus_gen`` (planted structure at every threshold).
The default run uses a few thousand candidates; the ``slow`` tests use more
than 20,000, both presets, and the same job on two worker processes.
"""

import collections
import glob
import json
import os

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from filters.frequency import ApplyCorpusFilters
from filters.presets import get_preset
from tests.filters import corpus_gen, reference

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS_LIMIT = 20  # instead of 1000, to keep the over-captioned images small

TPI, IPT, RARE = reference.TEXTS_PER_IMAGE, reference.IMAGES_PER_TEXT, reference.RARE_NGRAM


def counted_only(corpus, preset):
    """Rows rejected earlier count under the raw base only (the job sends none otherwise)."""
    return corpus.counted_only if preset.counting_base == "raw" else []


def run_beam(corpus, preset, out_dir, workers=1, **transform_kw):
    """Run ``ApplyCorpusFilters`` on the FnApiRunner; returns (rejected dict, stats dict, counters)."""
    if workers > 1:
        # Workers are fresh interpreters (`python -m ...sdk_worker_main`): they
        # must be able to import this repository's packages.
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
        options = PipelineOptions(direct_num_workers=workers, direct_running_mode="multi_processing")
    else:
        options = PipelineOptions()
    pipeline = beam.Pipeline(runner=FnApiRunner(), options=options)
    out = {
        "survivors": pipeline | "Survivors" >> beam.Create(corpus.survivors),
        "counted_only": pipeline | "CountedOnly" >> beam.Create(counted_only(corpus, preset)),
    } | ApplyCorpusFilters(preset, **transform_kw)
    if workers > 1:
        # Which processes ran the per-element work: shows the option is honoured.
        out["pids"] = (out["rejected"] | "Pid" >> beam.Map(lambda _: os.getpid())
                       | "Pids" >> beam.Distinct())
    for name in out:
        (out[name]
         | f"Json{name}" >> beam.Map(json.dumps, sort_keys=True)
         | f"Write{name}" >> beam.io.WriteToText(os.path.join(out_dir, name)))
    result = pipeline.run()
    result.wait_until_finish()

    def read(name):
        lines = []
        for path in sorted(glob.glob(os.path.join(out_dir, name + "-*"))):
            with open(path) as f:
                lines += [json.loads(line) for line in f]
        return lines

    rejected_rows = read("rejected")
    rejected = dict(rejected_rows)
    assert len(rejected) == len(rejected_rows), "a key was rejected more than once"
    stats = dict(read("stats"))
    if workers > 1:
        pids = set(read("pids"))
        assert len(pids) == workers and os.getpid() not in pids, pids
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace("filters"))["counters"]
    }
    return rejected, stats, counters


def assert_agrees(corpus, preset, out_dir, **kw):
    expected, expected_stats = reference.corpus_filters(corpus.survivors, counted_only(corpus, preset), preset)
    got, stats, counters = run_beam(corpus, preset, out_dir, **kw)
    if got != expected:
        only_beam = {k: v for k, v in got.items() if expected.get(k) != v}
        only_ref = {k: v for k, v in expected.items() if got.get(k) != v}
        pytest.fail(f"{len(only_beam)} keys differ in Beam, {len(only_ref)} in the reference; "
                    f"e.g. {list(only_beam.items())[:3]} vs {list(only_ref.items())[:3]}")
    assert counters == dict(collections.Counter(expected.values()))
    for name in ("texts_per_image", "images_per_text"):
        assert stats.get(name) == expected_stats.get(name), name
    coc, expected_coc = stats["count_of_counts"], expected_stats["count_of_counts"]
    for field in ("cut_count", "vocab_size", "num_ngrams", "num_occurrences"):
        assert coc[field] == expected_coc[field], field
    if coc["bucketing"] == "exact":
        assert coc["counts"] == {str(c): n for c, n in expected_coc["counts"].items()}
    return got, stats


def assert_planted(corpus, rejected, preset):
    """The planted groups end where the rules say (checked on the agreed output)."""
    reason = {name: collections.Counter(rejected.get(k, "kept") for k in keys)
              for name, keys in corpus.planted.items()}
    by_phash = preset.image_identity == "phash"
    raw = preset.counting_base == "raw"
    limit_t, limit_m = preset.max_texts_per_image, preset.max_images_per_text
    if limit_t == 0:
        assert not any(TPI in r for r in reason.values())
    if limit_t == corpus.texts_limit:
        assert set(reason["tpi_over"]) == {TPI}
        assert set(reason["tpi_wins"]) == {TPI}
        assert TPI not in reason["tpi_at"] and TPI not in reason["tpi_case"]
        assert (set(reason["tpi_phash"]) == {TPI}) == by_phash
        assert set(reason["ipt_after_tpi_image"]) == {TPI}
    if "tpi_big_over" in reason and limit_t == len(corpus.planted["tpi_big_at"]):
        assert set(reason["tpi_big_over"]) == {TPI}
        assert TPI not in reason["tpi_big_at"]
    if limit_m == 0:
        assert not any(IPT in r for r in reason.values())
    else:
        assert limit_m == corpus.images_limit
        assert set(reason["ipt_over"]) == {IPT}
        assert set(reason["ipt_case"]) == {IPT}
        assert set(reason["ipt_wins"]) == {IPT}
        # Every count sees every row of the pool: the over-captioned image
        # still shares the text, so it is on M+1 images.
        assert set(reason["ipt_after_tpi"]) == {IPT}
        assert (set(reason["ipt_small"]) == {IPT}) == raw
        assert IPT not in reason["ipt_at"] and IPT not in reason["ipt_dup_key"]
        assert (IPT in reason["ipt_phash"]) == (not by_phash)
    assert set(reason["hapax"]) == {RARE}
    if preset.min_ngram_count == corpus.rare_count and raw:
        assert set(reason["rare_below"]) == {RARE}
        assert set(reason["rare_at"]) == set(reason["rare_above"]) == {"kept"}
        assert set(reason["occurrences"]) == {"kept"}  # 30 and 20 occurrences in 10 texts
    if preset.vocab_size == corpus.vocab_size_at_tie and raw:
        assert set(reason["tie"]) == {"kept"}
        assert set(reason["below_tie"]) == {RARE}


def presets_for(corpus, texts_limit=TEXTS_LIMIT):
    return {
        "align": get_preset("align", max_texts_per_image=texts_limit, vocab_size=corpus.vocab_size_at_tie),
        "cc12m": get_preset("cc12m"),
        # cc12m's word-type rule with ALIGN's sharing limits switched on
        "cc12m_sharing": get_preset("cc12m", max_texts_per_image=texts_limit,
                                    max_images_per_text=corpus.images_limit),
    }


@pytest.fixture(scope="module")
def small_corpus():
    return corpus_gen.generate(3000, seed=1, texts_limit=TEXTS_LIMIT)


@pytest.mark.parametrize("preset_name", ["align", "cc12m", "cc12m_sharing"])
def test_agrees_with_reference_small(small_corpus, preset_name, tmp_path):
    preset = presets_for(small_corpus)[preset_name]
    # A tiny frequent-n-gram side input, so most vocabulary pairs go through
    # the join; and the hot-key path of the n-gram counts.
    rejected, stats = assert_agrees(small_corpus, preset, str(tmp_path), frequent_ngrams=20, hot_key_fanout=8)
    assert_planted(small_corpus, rejected, preset)
    assert stats["count_of_counts"]["cut_count"] == (
        small_corpus.tie_count if preset_name == "align" else small_corpus.rare_count)


def test_survivors_counting_base_agrees_with_reference(small_corpus, tmp_path):
    preset = get_preset("align", max_texts_per_image=TEXTS_LIMIT, vocab_size=small_corpus.vocab_size_at_tie,
                        counting_base="survivors")
    rejected, _ = assert_agrees(small_corpus, preset, str(tmp_path), frequent_ngrams=0, hot_key_fanout=0)
    assert_planted(small_corpus, rejected, preset)


# CI's integration run (each worker process starts Beam); the default run's agreement tests check the same
# output in process, against the same reference.
@pytest.mark.integration
def test_two_worker_processes_give_identical_output(small_corpus, tmp_path):
    preset = presets_for(small_corpus)["cc12m_sharing"]
    one, one_stats = assert_agrees(small_corpus, preset, str(tmp_path / "one"))
    two, two_stats = assert_agrees(small_corpus, preset, str(tmp_path / "two"), workers=2)
    assert two == one and two_stats == one_stats


def test_agrees_with_reference_small_phash_identity(small_corpus, tmp_path):
    preset = get_preset("align", max_texts_per_image=TEXTS_LIMIT, image_identity="phash",
                        vocab_size=small_corpus.vocab_size_at_tie)
    rejected, _ = assert_agrees(small_corpus, preset, str(tmp_path), frequent_ngrams=0, hot_key_fanout=0)
    assert_planted(small_corpus, rejected, preset)


@pytest.fixture(scope="module")
def large_corpus():
    corpus = corpus_gen.generate(20_000, seed=0, texts_limit=TEXTS_LIMIT, big_image_texts=1000)
    assert len(corpus.survivors) + len(corpus.counted_only) >= 20_000
    return corpus


@pytest.mark.slow
@pytest.mark.parametrize("preset_name", ["align", "cc12m"])
def test_agrees_with_reference_20k_one_and_two_workers(large_corpus, preset_name, tmp_path):
    preset = presets_for(large_corpus)[preset_name]
    one, one_stats = assert_agrees(large_corpus, preset, str(tmp_path / "one"))
    assert_planted(large_corpus, one, preset)
    two, two_stats = assert_agrees(large_corpus, preset, str(tmp_path / "two"), workers=2)
    assert two == one and two_stats == one_stats


@pytest.mark.slow
@pytest.mark.parametrize("preset_name", ["align", "cc12m"])
def test_agrees_with_reference_20k_preset_texts_limit(large_corpus, preset_name, tmp_path):
    """The presets' own max_texts_per_image (1000) on images with 1000 and 1001 alt-texts."""
    preset = get_preset(preset_name, **({"vocab_size": large_corpus.vocab_size_at_tie} if preset_name == "align"
                                        else {"max_texts_per_image": 1000, "max_images_per_text": 10}))
    assert preset.max_texts_per_image == len(large_corpus.planted["tpi_big_at"]) == 1000
    rejected, _ = assert_agrees(large_corpus, preset, str(tmp_path), frequent_ngrams=100, hot_key_fanout=4)
    assert_planted(large_corpus, rejected, preset)
