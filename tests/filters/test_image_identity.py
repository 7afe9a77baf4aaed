"""What counts as one image for the per-image counts (``image_identity``).

The default must never pool images a person calls different: pooled, their
alt-texts are counted together toward ``max_texts_per_image`` and
``max_images_per_text``. The identities are computed on the job's own
per-record path (``judge_record``), then named by ``filters.frequency``.
"""

import itertools

from benchmarks.image_identity import encode, flat_colours, small_text_banners, web_banners
from filters.frequency import image_identity
from filters.presets import get_preset
from filters.record import Candidate, judge_record


# A 728x90 web banner is below ALIGN's size and aspect rules; identity is not.
BANNER_SIZES = dict(min_shorter_side=50, max_aspect_ratio=10.0)


def identities(images, preset):
    out = []
    for i, data in enumerate(encode(img) for img in images):
        judged = judge_record(Candidate(f"k{i}", f"https://x/{i}.jpg", "a plain banner image", data), preset)
        assert judged.reason is None
        candidate = judged.candidate
        out.append(image_identity((candidate.key, candidate.sha256, candidate.phash, candidate.text),
                                  preset.image_identity))
    return out


def test_flat_colours_and_text_banners_are_different_images_by_default():
    assert get_preset("align").image_identity == get_preset("cc12m").image_identity == "sha256"
    preset = get_preset("align", **BANNER_SIZES)
    for images in (flat_colours(), web_banners(), small_text_banners()):
        ids = identities(images, preset)
        assert len(set(ids)) == len(ids)


def test_phash_pools_them_which_is_why_it_is_not_the_default():
    preset = get_preset("align", image_identity="phash", **BANNER_SIZES)
    ids = identities(flat_colours(), preset)
    assert len(set(ids)) < len(ids) / 2
    banner_ids = identities(web_banners(), preset)
    assert any(a == b for a, b in itertools.combinations(banner_ids, 2))


def test_a_rejected_row_gets_the_identity_a_survivor_would_get():
    data = encode(flat_colours()[3])
    for identity in ("sha256", "phash"):
        preset = get_preset("align", image_identity=identity)
        kept = judge_record(Candidate("k", "u", "a flat orange image", data), preset).candidate
        small = get_preset("align", image_identity=identity, min_shorter_side=1000)
        rejected = judge_record(Candidate("k", "u", "a flat orange image", data), small)
        assert rejected.reason == "image_size/too_small" and rejected.counted
        row = rejected.candidate
        assert (row.key, row.sha256, row.phash, row.text) == (
            kept.key, kept.sha256, kept.phash if identity == "phash" else "", kept.text)
        survivors_base = get_preset("align", min_shorter_side=1000, counting_base="survivors")
        assert not judge_record(Candidate("k", "u", "a flat orange image", data), survivors_base).counted
