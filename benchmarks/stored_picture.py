"""The stored picture's resample: its fidelity to a float64 Lanczos-3 reference and its CPU, before and now.

    python -m benchmarks.stored_picture [--photos 280] [--repeats 3] [--json PATH]

Pictures: photographs (``benchmarks.helpers.images.candidate``), half with
the longer side 400-800 px (downscaled to the preset's ``output_max_side`` at
scales below 2, decoded whole) and half 1000-2000 px (scales 2-4; a JPEG of
2048 px or more decodes at a DCT scale first). Every picture whose longer
side is over ``output_max_side`` counts; the others are stored as they came.

Fidelity: the pixels each path stores before its JPEG encode against the
full decode resampled to the same size in float64 Lanczos-3
(``lanczos3_reference``): PSNR (dB) and SSIM, median and minimum per size
class, and how many pictures the present path serves at least as well. The
paths: ``before``, the resampler this project used until now (PIL's
antialiased bicubic kernel as an OpenCV separable filter, sampled
bilinearly, on a PIL picture made RGB and cropped, copied here as it was),
and ``now``, ``filters.image.resample`` on the decoded pixels.

CPU: per re-encoded picture, the whole stored picture (decode, resample,
encode: the previous ``stored_picture`` against ``filters.image
.stored_picture``) and the resample alone (the previous ``downscale`` of a
decoded RGB picture against ``resample`` of the decoded pixels), the arms
interleaved ``--repeats`` times, medians. They run with the build's limits:
one BLAS thread (``threadpoolctl``), one OpenCV thread, and glibc told to
keep freed buffers (``common.allocator.keep_freed_buffers``), as the
build's workers run them.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import time
import warnings

import numpy as np
from PIL import Image

from benchmarks import harness, record
from benchmarks.helpers.images import candidate, lanczos3_reference, psnr, ssim
from common import allocator
from common.images import orient
from filters import image as image_rules
from filters.presets import get_preset

SIZE_CLASSES = {"400-800 px": (400, 800), "1000-2000 px": (1000, 2000)}


# ---------------------------------------------------------------------------
# The previous path, as it was
# ---------------------------------------------------------------------------


def before_taps(scale: float) -> np.ndarray:
    """PIL's antialiased BICUBIC kernel (a = -0.5, support widened by ``scale``) at whole-pixel offsets."""
    reach = int(math.ceil(2 * scale))
    x = np.abs(np.arange(-reach, reach + 1) / scale)
    a = -0.5
    taps = np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0))
    return (taps / taps.sum()).astype(np.float32)


def before_downscale(rgb: Image.Image, size) -> Image.Image:
    """The previous ``filters.image.downscale``: PIL box reduction, bicubic taps by OpenCV, bilinear sampling."""
    import cv2

    cv2.setNumThreads(1)
    width, height = size
    factor = int(min(rgb.width / width, rgb.height / height) / 2)
    if factor > 1:
        rgb = rgb.reduce(factor, box=(0, 0, rgb.width - rgb.width % factor, rgb.height - rgb.height % factor))
    pixels = np.asarray(rgb)
    filtered = cv2.sepFilter2D(pixels, -1, before_taps(rgb.width / width), before_taps(rgb.height / height),
                               borderType=cv2.BORDER_REFLECT)
    return Image.fromarray(cv2.resize(filtered, (width, height), interpolation=cv2.INTER_LINEAR))


def before_decoded(data: bytes, header, preset):
    """The previous ``stored_picture``'s decode of a picture to downscale: (upright RGB picture, output size)."""
    target = image_rules.thumbnail_size((header.width, header.height), preset.output_max_side)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with image_rules.open_image(data) as img:
            if img.format in image_rules.JPEG_FAMILY:
                swapped = (img.width, img.height) != (header.width, header.height)
                wanted = (2 * target[1], 2 * target[0]) if swapped else (2 * target[0], 2 * target[1])
                drafted = img.draft("RGB", wanted)
                img.load()
                if drafted is not None:
                    box = drafted[1]
                    img = img.crop((0, 0, max(1, int(box[2])), max(1, int(box[3]))))
            else:
                img.load()
            rgb = image_rules.to_rgb(orient(img, header.orientation))
    return rgb, target


def before_picture(data: bytes, header, preset) -> Image.Image:
    """The previous ``stored_picture``'s picture before its encode."""
    return before_downscale(*before_decoded(data, header, preset))


def before_stored(data: bytes, header, preset) -> bytes:
    out = io.BytesIO()
    before_picture(data, header, preset).save(out, format="JPEG", quality=preset.output_jpeg_quality)
    return out.getvalue()


# ---------------------------------------------------------------------------
# The present path's pixels before the encode
# ---------------------------------------------------------------------------


def now_picture(data: bytes, header, preset) -> Image.Image:
    """What ``stored_picture`` encodes, for a picture it downscales."""
    target = image_rules.thumbnail_size((header.width, header.height), preset.output_max_side)
    with image_rules.open_image(data) as img:
        pixels = image_rules.decoded_pixels(img, header, target)
    swapped = header.orientation in image_rules.SWAPS_SIDES
    picture = orient(Image.fromarray(image_rules.resample(pixels, target[::-1] if swapped else target)),
                     header.orientation)
    return picture.convert("RGB")


def full_decode(data: bytes, header) -> np.ndarray:
    with image_rules.open_image(data) as img:
        img.load()
        return np.asarray(image_rules.to_rgb(orient(img, header.orientation)))


# ---------------------------------------------------------------------------


def fidelity(pictures, preset) -> dict:
    """PSNR and SSIM of each path against the float64 Lanczos-3 reference, per size class and scale."""
    groups = {}
    for size_class, data, header in pictures:
        target = image_rules.thumbnail_size((header.width, header.height), preset.output_max_side)
        full = full_decode(data, header)
        reference = lanczos3_reference(full, target)
        scale = max(header.width, header.height) / max(target)
        entry = {path: (psnr(picture, reference), ssim(picture, reference))
                 for path, picture in (("before", np.asarray(before_picture(data, header, preset))),
                                       ("now", np.asarray(now_picture(data, header, preset))))}
        group = f"{size_class}, scale {'below 2' if scale < 2 else '2 or more'}"
        groups.setdefault(group, []).append(entry)
    out = {}
    for group, entries in sorted(groups.items()):
        summary = {"pictures": len(entries)}
        for path in ("before", "now"):
            db = [e[path][0] for e in entries]
            index = [e[path][1] for e in entries]
            summary[path] = {"psnr_db_median": round(statistics.median(db), 2), "psnr_db_min": round(min(db), 2),
                             "ssim_median": round(statistics.median(index), 5), "ssim_min": round(min(index), 5)}
        summary["now_at_least_as_close_psnr"] = sum(e["now"][0] >= e["before"][0] for e in entries)
        summary["now_at_least_as_close_ssim"] = sum(e["now"][1] >= e["before"][1] for e in entries)
        out[group] = summary
    return out


def cpu_ms(fn, items) -> float:
    """CPU-ms per item of one pass of ``fn`` over ``items`` (this process, every thread)."""
    start = time.process_time()
    for item in items:
        fn(item)
    return 1000 * (time.process_time() - start) / len(items)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=280,
                        help="photographs, half of each size class (default 280: ~240 over output_max_side)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the CPU arms (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    if args.photos < 2 or args.repeats < 1:
        parser.error("--photos must be at least 2 and --repeats at least 1")
    import cv2
    from threadpoolctl import threadpool_limits

    run = record.Run()
    threadpool_limits(1)
    cv2.setNumThreads(1)
    allocator.keep_freed_buffers()
    preset = get_preset("align")
    pictures = []
    per_class = (args.photos + 1) // 2
    for number, (size_class, longer) in enumerate(SIZE_CLASSES.items()):
        for index in range(per_class):
            data = candidate(args.seed + number, index, longer_side=longer)["jpg"]
            header, reason = image_rules.read_header(data, preset)
            if reason is None and not image_rules.stored_as_read(header, preset) \
                    and max(header.width, header.height) > preset.output_max_side:
                pictures.append((size_class, data, header))
    print(f"{len(pictures)} photographs to downscale to {preset.output_max_side} px", flush=True)
    quality = fidelity(pictures, preset)
    for group, summary in quality.items():
        print(f"{group:36s} n={summary['pictures']:4d}  PSNR before {summary['before']['psnr_db_median']:6.2f} "
              f"now {summary['now']['psnr_db_median']:6.2f} dB (min {summary['before']['psnr_db_min']:.2f} / "
              f"{summary['now']['psnr_db_min']:.2f})  SSIM before {summary['before']['ssim_median']:.5f} "
              f"now {summary['now']['ssim_median']:.5f}", flush=True)

    items = [(data, header) for _, data, header in pictures]
    rgb = [before_decoded(data, header, preset) for data, header in items]
    raw = []
    for data, header in items:
        target = image_rules.thumbnail_size((header.width, header.height), preset.output_max_side)
        with image_rules.open_image(data) as img:
            raw.append((image_rules.decoded_pixels(img, header, target), target[::-1]
                        if header.orientation in image_rules.SWAPS_SIDES else target))
    arms = {
        "stored picture, before": lambda: cpu_ms(lambda item: before_stored(item[0], item[1], preset), items),
        "stored picture, now": lambda: cpu_ms(lambda item: image_rules.stored_picture(item[0], item[1], preset),
                                              items),
        "resample alone, before (decoded upright RGB picture)":
            lambda: cpu_ms(lambda item: before_downscale(*item), rgb),
        "resample alone, now (decoded pixels, grey or RGB)":
            lambda: cpu_ms(lambda item: image_rules.resample(*item), raw),
    }
    for arm in arms.values():  # warm-up: imports, caches
        arm()
    runs = harness.interleaved(arms, args.repeats)
    cpu = {name: round(statistics.median(values), 3) for name, values in runs.items()}
    for name, value in cpu.items():
        print(f"{name:48s} {value:7.3f} CPU-ms per picture", flush=True)
    figures = {
        "output_max_side": preset.output_max_side, "pictures": len(pictures),
        "reference": "float64 Lanczos-3 of the full decode (benchmarks.helpers.images.lanczos3_reference)",
        "fidelity": quality, "cpu_ms_per_picture": cpu, "cpu_ms_runs": runs, "repeats": args.repeats,
    }
    run.write("stored_picture", figures, args.json)


if __name__ == "__main__":
    main()
