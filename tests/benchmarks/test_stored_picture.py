"""The stored picture's benchmark (``benchmarks.stored_picture``) and its float64 Lanczos-3 reference."""

import json

import numpy as np
import pytest
from PIL import Image

from benchmarks import stored_picture
from benchmarks.helpers.images import lanczos3_reference, psnr


def smooth_picture(size, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)


@pytest.mark.parametrize("size, target", [((800, 600), (512, 384)), ((2000, 1100), (512, 282)),
                                          ((300, 700), (219, 512))])
def test_the_reference_is_pillows_lanczos_in_float(size, target):
    picture = smooth_picture(size)
    reference = lanczos3_reference(np.asarray(picture), target)
    assert reference.shape == (target[1], target[0], 3)
    # Pillow rounds to 8 bits after each pass: the same filter, to its rounding.
    assert psnr(picture.resize(target, Image.LANCZOS), reference) > 50
    grey = lanczos3_reference(np.asarray(picture.convert("L")), target)
    assert grey.shape == (target[1], target[0])


def test_the_reference_of_the_same_size_is_the_picture():
    pixels = np.asarray(smooth_picture((64, 48)))
    assert np.allclose(lanczos3_reference(pixels, (64, 48)), pixels)


def test_the_benchmark_measures_both_paths(tmp_path, capsys):
    path = tmp_path / "stored_picture.json"
    stored_picture.main(["--photos", "4", "--repeats", "1", "--json", str(path)])
    figures = json.loads(path.read_text())["figures"]
    assert figures["pictures"] >= 2
    assert sum(group["pictures"] for group in figures["fidelity"].values()) == figures["pictures"]
    for group in figures["fidelity"].values():
        for path_name in ("before", "now"):
            assert 30 < group[path_name]["psnr_db_median"] < 80 and 0.9 < group[path_name]["ssim_median"] <= 1
    assert len(figures["cpu_ms_per_picture"]) == 4 and all(v > 0 for v in figures["cpu_ms_per_picture"].values())


def test_a_bad_count_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        stored_picture.main(["--photos", "1"])
    assert exit_.value.code == 2 and "--photos" in capsys.readouterr().err
