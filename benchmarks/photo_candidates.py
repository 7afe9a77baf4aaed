"""Photo-sized candidates for the throughput benchmarks: ~40 kB JPEGs of photographs, as img2dataset writes them.

    python -m benchmarks.photo_candidates --out DIR --num_candidates 20000 [--seed 0] [--rows_per_file 5000] [--processes 1]
    python -m benchmarks.photo_candidates --out DIR --num_candidates 103000 --longer_side 216,240 --aspect 1,1.05

The second kind (small pictures, every shorter side over 200 px) is the
many-shards run's input: a build whose cost is per record and per shard,
not per pixel.

The sample corpus (``samplegen``) is made to exercise every rule, and most
of its images are small drawings; a build's cost on the web is set by
photographs of a few hundred pixels. Each candidate here
(``benchmarks.helpers.images.candidate``) is a crop of one of the
photographs shipped inside scikit-image and scikit-learn
(``samplegen.photos``), rescaled to a longer side of 400-800 px at an
aspect ratio (width/height) of 0.6-1.6 and saved as a baseline JPEG at
quality 70-90 (4:2:0): 40 kB on average, as web photographs of that size are.

Written as img2dataset writes a Parquet shard: ``key, url, caption, jpg,
width, height, status`` (``status`` success). Captions are the photograph's
subject phrase, a framing and a running number: 3-20 words, so ALIGN's text
rules keep them, and distinct, so no caption is shared by more than one
image. Every row passes the ALIGN preset: a corpus of this kind is written
whole, and the figures are the cost of writing photographs, not of
rejecting them. Deterministic: the same seed and count give the same bytes,
whatever ``--rows_per_file`` and ``--processes`` are. ``candidates.json``
beside the files states the count, mean JPEG size and the sizes' range.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.helpers.images import ASPECT, LONGER_SIDE, write_candidates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for the Parquet files (created)")
    parser.add_argument("--num_candidates", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows_per_file", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=1, help="processes rendering files in parallel")
    parser.add_argument("--longer_side", default="%d,%d" % LONGER_SIDE, help="MIN,MAX of the longer side in pixels")
    parser.add_argument("--aspect", default="%g,%g" % ASPECT, help="MIN,MAX of the aspect ratio (longer / shorter)")
    args = parser.parse_args(argv)
    if args.num_candidates < 1 or args.rows_per_file < 1:
        raise SystemExit("error: --num_candidates and --rows_per_file must be at least 1")
    try:
        longer_side = tuple(int(v) for v in args.longer_side.split(","))
        aspect = tuple(float(v) for v in args.aspect.split(","))
    except ValueError:
        raise SystemExit("error: --longer_side and --aspect are MIN,MAX (e.g. 400,800 and 0.6,1.6)") from None
    if len(longer_side) != 2 or len(aspect) != 2 or not 8 <= longer_side[0] <= longer_side[1] or not 0 < aspect[0] <= aspect[1]:
        raise SystemExit("error: --longer_side and --aspect are MIN,MAX with 8 <= MIN <= MAX (sides) and 0 < MIN <= MAX")
    if os.path.isdir(args.out) and any(name.endswith(".parquet") for name in os.listdir(args.out)):
        raise SystemExit(f"error: --out {args.out} already holds Parquet files: choose an empty directory")
    start = time.perf_counter()
    info = write_candidates(args.out, args.num_candidates, args.seed, args.rows_per_file, args.processes,
                            longer_side, aspect)
    print(f"photo candidates: {info['candidates']:,} rows in {info['files']} file(s), JPEGs "
          f"{info['mean_jpeg_bytes'] / 1000:.1f} kB on average ({info['min_jpeg_bytes'] / 1000:.1f}-"
          f"{info['max_jpeg_bytes'] / 1000:.1f} kB), {time.perf_counter() - start:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
