"""Size and aspect judge the source size the input states, not the downloader's resized image."""

import io

import pytest
from PIL import Image

from common.schema import Candidate
from filters.presets import get_preset
from filters.record import filter_record


def stored_jpeg(size=(256, 256)):
    out = io.BytesIO()
    Image.new("RGB", size, (90, 120, 30)).save(out, format="JPEG")
    return out.getvalue()


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
    result, got, measures = filter_record(candidate(source), get_preset("align"))
    assert got == reason
    judged = source if source != (0, 0) else (256, 256)
    assert (result.width, result.height) == judged  # what the shards' original_* carry
    assert measures["shorter_side"] == min(judged)
    if reason is None:
        assert (result.stored_width, result.stored_height) == (256, 256)
