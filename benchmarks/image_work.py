"""The stored picture's downscale in a build: ``filters.image.downscale`` against PIL's BICUBIC thumbnail.

    python -m benchmarks.image_work [--images 600] [--repeats 5]

Images: the download benchmark's web-typical JPEGs (400-800 px wide,
aspect 0.6-1.6; ``benchmarks.helpers.images.make_images``),
decoded once. CPU-ms per image (median of ``--repeats`` passes) of the decode, of the
pHash (and of a cheaper pHash whose resize to 32x32
box-reduces first, with how often it equals the full-size one), of the
downscale to the preset's ``output_max_side`` each way (images larger than
it) and of the JPEG encode after it.

Fidelity, on the same images:

- the downscale's difference from PIL's antialiased BICUBIC (PSNR, dB);
- the pHash of the picture against the pHash of its stored copy
  (downscaled each way, JPEG at the preset's quality): "equal" is what
  ``image_identity=phash`` and the in-corpus pHash dedup rely on.
"""

from __future__ import annotations

import argparse
import io
import statistics

import numpy as np
from PIL import Image

from benchmarks import harness, record
from benchmarks.helpers.images import hamming, make_images
from filters import image as image_rules
from filters.presets import get_preset


def pil_thumbnail(img: Image.Image, max_side: int) -> Image.Image:
    img = img.copy()
    img.thumbnail((max_side, max_side), Image.BICUBIC)
    return img


def stored_copy(img: Image.Image, max_side: int, quality: int, shrink) -> Image.Image:
    out = io.BytesIO()
    (shrink(img, max_side) if max(img.size) > max_side else img).save(out, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(out.getvalue())).convert("RGB")


def decode(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def reduced_phash(img: Image.Image) -> str:
    """imagehash's pHash of the 32x32 picture PIL's Lanczos gives with ``reducing_gap=3`` (a box reduction first)."""
    import imagehash

    return str(imagehash.phash(img.convert("L").resize((32, 32), Image.LANCZOS, reducing_gap=3.0)))


def psnr(a: Image.Image, b: Image.Image) -> float:
    diff = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return float(10 * np.log10(255 ** 2 / max(np.mean(diff ** 2), 1e-12)))


def cpu_ms(fn, items, repeats: int) -> float:
    """Median CPU-ms per item of ``fn`` over ``items`` (no warm-up pass: nothing here compiles or caches)."""
    return harness.cpu_ms_per_item(lambda: [fn(item) for item in items], len(items), repeats, warmup=False)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    run = record.Run()
    preset = get_preset("align")
    side, quality = preset.output_max_side, preset.output_jpeg_quality
    encoded = make_images(args.images, seed=1)
    pictures = [decode(data) for data in encoded]
    larger = [p for p in pictures if max(p.size) > side]

    steps = {
        "decode to RGB (PIL)": cpu_ms(decode, encoded, args.repeats),
        "pHash (imagehash, full size)": cpu_ms(image_rules.perceptual_hash, pictures, args.repeats),
        "pHash after PIL's reducing_gap=3 resize to 32x32 (not used by the build)":
            cpu_ms(reduced_phash, pictures, args.repeats),
        f"downscale to {side} px, PIL BICUBIC thumbnail": cpu_ms(lambda p: pil_thumbnail(p, side), larger, args.repeats),
        f"downscale to {side} px, filters.image.downscale":
            cpu_ms(lambda p: image_rules.downscale(p, side), larger, args.repeats),
        f"JPEG encode at quality {quality} after the downscale":
            cpu_ms(lambda p: p.save(io.BytesIO(), format="JPEG", quality=quality),
                   [image_rules.downscale(p, side) for p in larger], args.repeats),
    }
    quality_db = [psnr(image_rules.downscale(p, side), pil_thumbnail(p, side)) for p in larger]
    robustness = {}
    for name, shrink in (("PIL BICUBIC thumbnail", pil_thumbnail), ("downscale", image_rules.downscale)):
        distances = [hamming(image_rules.perceptual_hash(p),
                             image_rules.perceptual_hash(stored_copy(p, side, quality, shrink))) for p in pictures]
        robustness[name] = {"equal": sum(d == 0 for d in distances) / len(distances),
                            "histogram": {str(d): distances.count(d) for d in sorted(set(distances))}}
    reduced_equal = sum(image_rules.perceptual_hash(p) == reduced_phash(p) for p in pictures) / len(pictures)
    figures = {
        "reduced_phash_equals_full_size": reduced_equal,
        "images": len(pictures), "larger_than_output": len(larger), "cpu_ms_per_image": steps,
        "downscale_psnr_vs_pil_bicubic_db": {"median": statistics.median(quality_db), "min": min(quality_db)},
        "phash_of_stored_copy": robustness,
    }
    for name, value in steps.items():
        print(f"{name:75s} {value:6.3f} CPU-ms")
    print(f"pHash after the reducing_gap=3 resize equals the full-size one: {reduced_equal:.3f}")
    print(f"downscale vs PIL BICUBIC: PSNR median {figures['downscale_psnr_vs_pil_bicubic_db']['median']:.1f} dB, "
          f"min {figures['downscale_psnr_vs_pil_bicubic_db']['min']:.1f} dB")
    for name, entry in robustness.items():
        print(f"pHash of the stored copy equals the picture's ({name}): {entry['equal']:.3f}")
    run.write("image_work", figures, args.json)


if __name__ == "__main__":
    main()
