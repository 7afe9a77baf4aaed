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
    assert (p.min_ngram_count, p.vocab_size) == (20, 0)


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


def test_every_param_is_printed_with_its_sense():
    printed = presets.format_preset(presets.get_preset("cc12m"))
    for param in presets.PARAMS:
        assert param.name in printed and param.sense in printed


def test_near_duplicate_search_params():
    p = presets.get_preset("align")
    assert (p.near_duplicate_search, p.kmeans_sample_size, p.centroid_merge_cosine) == ("exact", 250_000, 0.0)
    p = presets.get_preset("cc12m", ["near_duplicate_search=buckets", "kmeans_sample_size=1e5", "centroid_merge_cosine=-1"])
    assert (p.near_duplicate_search, p.kmeans_sample_size, p.centroid_merge_cosine) == ("buckets", 100_000, -1.0)
    with pytest.raises(ValueError, match="near_duplicate_search must be one of 'exact', 'list_join', 'buckets', 'bucket_join'"):
        presets.get_preset("align", ["near_duplicate_search=approximate"])
    with pytest.raises(ValueError, match="near_duplicate_search"):
        presets.get_preset("align", near_duplicate_search="Exact")
    with pytest.raises(ValueError, match="image_identity"):
        presets.get_preset("align", ["image_identity=md5"])
