import pytest

from filters import presets


def test_align_values_follow_the_paper():
    p = presets.get_preset("align")
    assert (p.min_shorter_side, p.max_aspect_ratio, p.min_words, p.max_words) == (200, 3.0, 3, 20)
    assert (p.max_texts_per_image, p.max_images_per_text, p.vocab_size) == (1000, 10, 100_000_000)
    assert (p.num_clusters, p.nearest_clusters, p.bucket_size) == (4096, 10, 3)


def test_cc12m_values_follow_the_paper():
    p = presets.get_preset("cc12m")
    assert p.formats == ("JPEG",)
    assert (p.min_both_sides, p.max_aspect_ratio, p.max_words, p.max_word_repetition) == (400, 2.5, 256, 0.2)
    # Rare word *types* below 20 occurrences; no bigrams; no ALIGN sharing limits.
    assert (p.min_ngram_count, p.vocab_size, p.max_ngram_order) == (20, 0, 1)
    assert not presets.rule_enabled("max_texts_per_image", p.as_dict())
    assert not presets.rule_enabled("max_images_per_text", p.as_dict())
    assert p.counting_base == "raw" and p.image_identity == "sha256"


def test_threshold_sides_are_the_papers():
    align, cc12m = presets.get_preset("align"), presets.get_preset("cc12m")
    assert presets.keeps(align, "min_shorter_side", 201) and not presets.keeps(align, "min_shorter_side", 200)
    assert presets.keeps(cc12m, "min_both_sides", 401) and not presets.keeps(cc12m, "min_both_sides", 400)
    assert not presets.keeps(align, "max_aspect_ratio", 3.0) and presets.keeps(cc12m, "max_aspect_ratio", 2.5)
    assert not presets.keeps(cc12m, "max_aspect_ratio", 2.5000001)
    assert presets.keeps(align, "max_images_per_text", 10) and not presets.keeps(align, "max_images_per_text", 11)
    assert presets.keeps(cc12m, "max_images_per_text", 10**9)  # off in cc12m
    assert presets.keeps(cc12m, "min_ngram_count", 20) and not presets.keeps(cc12m, "min_ngram_count", 19)


def test_overrides_are_typed_and_checked():
    p = presets.get_preset("align", ["vocab_size=5000", "formats=jpeg,png", "dedup_in_corpus=true", "max_aspect_ratio=2.5"])
    assert p.vocab_size == 5000 and p.formats == ("JPEG", "PNG") and p.dedup_in_corpus is True
    assert p.max_aspect_ratio == 2.5
    with pytest.raises(ValueError, match="unknown parameter"):
        presets.get_preset("align", ["no_such=1"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        presets.get_preset("align", ["vocab_size"])
    with pytest.raises(ValueError, match="unknown preset"):
        presets.get_preset("laion")


def test_print_preset_says_each_rules_sense_for_this_preset():
    printed = presets.format_preset(presets.get_preset("cc12m"))
    for param in presets.PARAMS:
        assert param.name in printed and param.allowed() in printed
    line = {row.split()[0]: row for row in printed.splitlines()[1:]}
    assert "keep if max(w,h)/min(w,h) <= value (inclusive)" in line["max_aspect_ratio"]
    assert "keep if min(width, height) > value (exclusive)" in line["min_both_sides"]
    assert "1 - distinct words/words <= value" in line["max_word_repetition"]
    align = presets.format_preset(presets.get_preset("align"))
    assert "keep if max(w,h)/min(w,h) < value (exclusive)" in align


def test_overrides_are_printed_as_overrides():
    p = presets.get_preset("align", ["vocab_size=0", "min_ngram_count=2", "max_words=20"])
    assert p.name == "align" and p.overrides == (("vocab_size", 0), ("min_ngram_count", 2))
    assert p.describe() == "align with vocab_size=0, min_ngram_count=2"
    printed = presets.format_preset(p)
    assert printed.splitlines()[0] == "preset: align with vocab_size=0, min_ngram_count=2"
    starred = [row.split()[1] for row in printed.splitlines()[1:-1] if row.startswith("* ")]
    assert starred == ["vocab_size", "min_ngram_count"]
    assert presets.get_preset("align").describe() == "align"


@pytest.mark.parametrize("override, message", [
    ("min_shorter_side=-5", "min_shorter_side: must be an integer in [0, inf), got -5"),
    ("validation_fraction=7", "validation_fraction: must be a number in [0, 1], got 7.0"),
    ("max_aspect_ratio=nan", "max_aspect_ratio: must be a number in [1, inf), got nan"),
    ("max_records_per_shard=0", "max_records_per_shard: must be an integer in [1, inf), got 0"),
    ("output_jpeg_quality=101", "output_jpeg_quality: must be an integer in [1, 100], got 101"),
    ("num_clusters=2.5", "num_clusters: must be an integer in [1, inf), got '2.5'"),
    ("dedup_in_corpus=maybe", "dedup_in_corpus: must be true or false, got 'maybe'"),
    ("max_word_repetition=inf", "max_word_repetition: must be a number in [0, 1], got inf"),
    ("formats=", "formats: must be a comma-separated list of image formats, not empty, got ()"),
    ("counting_base=all", "counting_base: must be one of 'raw', 'survivors', got 'all'"),
    ("bucket_size=11", "bucket_size: must be at most nearest_clusters (10), got 11"),
])
def test_invalid_values_are_refused_with_the_parameter_and_its_range(override, message):
    with pytest.raises(presets.PresetError) as error:
        presets.get_preset("align", [override])
    assert str(error.value) == message and "\n" not in message


def test_keyword_values_are_type_checked():
    with pytest.raises(presets.PresetError, match="min_words: must be an integer"):
        presets.get_preset("align", min_words=True)
    with pytest.raises(presets.PresetError, match="max_words: must be an integer"):
        presets.get_preset("align", max_words="20")
    assert presets.get_preset("align", max_aspect_ratio=2).max_aspect_ratio == 2.0


def test_every_param_has_a_type_and_a_range_or_choices():
    for param in presets.PARAMS:
        assert param.type in (int, float, bool, str, tuple, list)
        if param.type in (int, float):
            assert param.low > -presets.INF, param.name
        if param.type is str:
            assert param.choices, param.name
        presets.check_value(param, param.default)


def test_near_duplicate_search_params():
    p = presets.get_preset("align")
    assert (p.near_duplicate_search, p.kmeans_sample_size, p.centroid_merge_cosine) == ("exact", 250_000, 0.0)
    p = presets.get_preset("cc12m", ["near_duplicate_search=buckets", "kmeans_sample_size=1e5", "centroid_merge_cosine=-1"])
    assert (p.near_duplicate_search, p.kmeans_sample_size, p.centroid_merge_cosine) == ("buckets", 100_000, -1.0)
    with pytest.raises(ValueError, match="near_duplicate_search: must be one of 'exact', 'buckets'"):
        presets.get_preset("align", ["near_duplicate_search=approximate"])
    with pytest.raises(ValueError, match="near_duplicate_search"):
        presets.get_preset("align", near_duplicate_search="Exact")
    with pytest.raises(ValueError, match="image_identity"):
        presets.get_preset("align", ["image_identity=md5"])
