"""No image bytes cross a shuffle: what each GroupByKey of the sample build receives, measured by the runner.

Every GroupByKey (CoGroupByKey, CombinePerKey and Reshuffle expand to one;
a combine counts where it shuffles, after lifting: its accumulators) is
measured by ``benchmarks.helpers.shuffles.ShuffleMeasuringRunner`` (the encoded
bytes appended to its grouping buffer, the SDK's own element counts), on the
session's sample build (``conftest.measured_sample_build``: the same job
the other sample tests read, so no extra build).

The bound, ``LIGHT_ROW_BYTES`` = 1 KiB per input candidate per shuffle: a
light row of this sample (key, url, text, hashes, verdict and where to read
the record again; Beam's RowCoder, ``pipeline.stages.light_rows``) encodes to
~300 B; a join of rows and verdicts, or a fate holding a row twice, stays
near 300-600 B per candidate, so 1 KiB is a light row with room to spare. The sample's images average ~5 kB (checked
below: at least four times the bound) and the re-encoded stored images are
larger, so a shuffle of images over even a fifth of the candidates goes
over it; so does a bounded sample of raw images (the ledger's 20 per
reason) on a sample of this size, and so does a whole ``Candidate`` record
even without its image (a pickled dataclass, ~1 kB: the verdict join of
such records is 1,075 B per candidate here): not a light row either.
"""

import glob

import apache_beam as beam
import pyarrow.parquet as pq

from benchmarks.helpers.shuffles import ShuffleMeasuringRunner

LIGHT_ROW_BYTES = 1024


def _by_name(shuffles, part):
    (found,) = [s for s in shuffles.shuffles if part in s.name]
    return found


def test_the_runner_measures_what_each_shuffle_receives():
    """200 images of 20,000 B grouped, counted per key, joined and dropped for light rows: each shuffle as it is."""
    images = 200
    with beam.Pipeline(runner=ShuffleMeasuringRunner()) as p:
        keyed = (p | beam.Create(range(images))
                 | "Images" >> beam.Map(lambda i: (i % 10, bytes([i % 256]) * 20_000)))
        light = keyed | "Light" >> beam.MapTuple(lambda k, image: (k, len(image)))
        _ = keyed | "GroupImages" >> beam.GroupByKey()
        _ = keyed | "CountImages" >> beam.combiners.Count.PerKey()
        _ = light | "GroupLight" >> beam.GroupByKey()
        # A CoGroupByKey flattens its inputs into one GroupByKey: both are counted there.
        _ = {"image": keyed, "size": light} | "JoinImages" >> beam.CoGroupByKey()
    shuffles = ShuffleMeasuringRunner.last
    shuffles.candidates = images
    heavy, counted, light, joined = (
        _by_name(shuffles, name) for name in ("GroupImages", "CountImages", "GroupLight", "JoinImages"))
    assert heavy.elements == images and 20_000 < heavy.bytes_per_element < 20_100
    # The combine is lifted: its shuffle receives one accumulator per key, not the images.
    assert counted.elements == 10 and counted.bytes_per_element < 100
    assert light.elements == images and light.bytes_per_element < 100
    assert joined.elements == 2 * images and 19_000 * images < joined.bytes < 21_000 * images
    assert shuffles.unmeasured == []
    assert shuffles.heavier_than(LIGHT_ROW_BYTES) == [joined, heavy]
    assert "GroupImages: 200 elements x 20,0" in shuffles.describe([heavy])


def test_every_shuffle_of_the_sample_build_is_measured(measured_sample_build, sample_dir):
    """The check below can fail: shuffles are found and sized, and an image is far over the bound."""
    _, funnel, shuffles = measured_sample_build
    assert shuffles.candidates == funnel["input"] > 1000
    assert len(shuffles.shuffles) >= 5
    assert shuffles.unmeasured == []
    assert sum(s.elements for s in shuffles.shuffles) >= funnel["input"]
    images = [len(data) for path in glob.glob(str(sample_dir / "candidates" / "*.parquet"))
              for data in pq.read_table(path, columns=["jpg"]).column(0).to_pylist() if data]
    assert sum(images) / len(images) >= 4 * LIGHT_ROW_BYTES


def test_no_shuffle_carries_more_than_light_rows(measured_sample_build):
    _, _, shuffles = measured_sample_build
    heavy = shuffles.heavier_than(LIGHT_ROW_BYTES)
    assert not heavy, (
        f"{len(heavy)} shuffle(s) carry more than a light row ({LIGHT_ROW_BYTES:,} B) per candidate over the "
        f"{shuffles.candidates:,} candidates: image bytes or whole records cross them\n" + shuffles.describe(heavy))
