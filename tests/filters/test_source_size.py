"""Size and aspect judge the source size the input states, not the downloader's resized image."""


import pytest

from common.schema import Candidate
from filters.presets import get_preset
from filters.image import read_header, stored_picture
from filters.record import judge_record
from tests import images as made


def stored_jpeg(size=(256, 256)):
    return made.solid(size, (90, 120, 30))


def candidate(source=(0, 0)):
    return Candidate(key="k", url="https://e.x/a.jpg", alt_text="a green field under a clear sky",
                     image=stored_jpeg(), source_width=source[0], source_height=source[1])


@pytest.mark.parametrize("source, reason", [
    ((150, 150), "image_size/too_small"),
    ((320, 200), "image_size/too_small"),
    ((900, 250), "image_aspect/too_elongated"),
    ((640, 480), None),
    ((0, 0), None),  # no source size stated: the stored 256x256 is judged
])
def test_source_size_decides(source, reason):
    judgement = judge_record(candidate(source), get_preset("align"))
    assert judgement.reason == reason
    result = judgement.candidate
    judged = source if source != (0, 0) else (256, 256)
    assert (result.width, result.height) == judged  # what the shards' original_* carry
    assert judgement.measures["shorter_side"] == min(judged)
    if reason is None:  # the stored picture is the image as stored, whatever the source size said
        stored, _ = stored_picture(result.image, read_header(result.image, get_preset("align"))[0], get_preset("align"))
        assert (stored.width, stored.height) == (256, 256)
