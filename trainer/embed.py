r"""Exports a trained model's image and text embeddings, with their keys, to Parquet.

    python -m trainer.embed out/train --shards out/corpus --split train --out out/embeddings
    python -m trainer.embed out/train --images out/sample/eval/test --out out/eval_embeddings
    python -m trainer.embed out/train --captions captions.txt --out out/caption_embeddings

Sources: a shard directory's split (every pair: its image and its alt-text),
a folder of images (searched recursively; a first-level directory is the
image's ``label``), or a caption list (a text file, one caption a line, or
``key<TAB>caption``). The output directory holds ``part-NNNNN.parquet``
files of ``--part_size`` rows in input order and ``embeddings.json`` (the
model's workdir and step, the source, the embedding size, the row count).

Columns: ``key`` (the shard's pair key, the image's path relative to the
folder, or the caption's key / line number), ``caption`` and
``text_embedding`` (null for a folder), ``image_embedding`` and
``thumbnail`` (a small JPEG, so ``trainer.search`` pages need nothing else;
null for a caption list), ``label``, ``source`` (the shard or image file).
Embeddings are float32 lists (``embed_dim`` long), L2-normalised.

Resumable: a part is written under a temporary name and renamed when
complete, and a run skips the parts that exist (without decoding their
images), so an interrupted export continues where it stopped. Running it
with another model, step, source or part size into the same directory is
refused. Batched on whatever device JAX has (CPU, GPU or TPU chip).
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from typing import Iterator, Optional, Sequence

import numpy as np

from common import cli
from trainer.evaluators import IMAGE_EXTENSIONS, chunks, encode_in_batches

MANIFEST = "embeddings.json"
PART_PATTERN = "part-{:05d}.parquet"
THUMBNAIL_SIDE = 128
DEFAULT_PART_SIZE = 4096


class Source:
    """An input split into numbered parts; ``rows(i)`` gives part ``i``'s rows."""

    kind = ""

    def describe(self) -> dict:
        raise NotImplementedError

    def num_rows(self) -> int:
        raise NotImplementedError

    def parts(self, part_size: int) -> Iterator[tuple[int, object]]:
        """(part index, raw part) in order; a raw part is cheap to skip."""
        raise NotImplementedError


class ShardSource(Source):
    kind = "shards"

    def __init__(self, data_dir: str, split: str):
        from trainer.eval_data import shard_split

        self.data_dir, self.split = data_dir, split
        self.files = shard_split(data_dir, split)

    def describe(self):
        return {"kind": self.kind, "path": os.path.abspath(self.data_dir), "split": self.split}

    def num_rows(self):
        from trainer.input_pipeline import shard_lengths

        return sum(shard_lengths(self.data_dir, self.split, self.files))

    def parts(self, part_size):
        import tensorflow as tf

        from trainer.input_pipeline import shard_reader

        # File order, serialized records only: a finished part is skipped unparsed.
        reader = shard_reader(self.data_dir, self.split)
        records = tf.data.Dataset.from_tensor_slices(self.files).flat_map(tf.autograph.experimental.do_not_convert(
            lambda path: reader.dataset(path).map(lambda r: (r, path))))
        for index, (serialized, paths) in enumerate(records.batch(part_size).as_numpy_iterator()):
            yield index, (serialized, paths)


class _ListSource(Source):
    """A source held as a list in memory (``items``), read from one file or folder (``location``)."""

    location = ""
    items: list = []

    def describe(self):
        return {"kind": self.kind, "path": os.path.abspath(self.location)}

    def num_rows(self):
        return len(self.items)

    def parts(self, part_size):
        for index, start in enumerate(range(0, len(self.items), part_size)):
            yield index, self.items[start:start + part_size]


class FolderSource(_ListSource):
    kind = "folder"

    def __init__(self, root: str):
        from trainer.eval_data import EvalDataError

        if not os.path.isdir(root):
            raise EvalDataError(f"{root}: no such image folder")
        self.location = root
        self.items = sorted(
            os.path.join(directory, name) for directory, _, names in os.walk(root)
            for name in names if name.lower().endswith(IMAGE_EXTENSIONS))
        if not self.items:
            raise EvalDataError(f"{root}: no {'/'.join(IMAGE_EXTENSIONS)} images in it")


class CaptionSource(_ListSource):
    kind = "captions"

    def __init__(self, path: str):
        from trainer.eval_data import EvalDataError

        if not os.path.isfile(path):
            raise EvalDataError(f"{path}: no such caption file")
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\r\n") for line in f]
        self.location, self.items = path, []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            key, tab, caption = line.partition("\t")
            if not tab:
                key, caption = str(number), line
            if not caption.strip():
                raise EvalDataError(f"{path}:{number}: key {key!r} has no caption")
            self.items.append((key, caption.strip()))
        if not self.items:
            raise EvalDataError(f"{path}: no captions in it")


def thumbnail(image_bytes: bytes, side: int = THUMBNAIL_SIDE) -> bytes:
    """A small upright JPEG of an encoded image (for result pages)."""

    from common.images import exif_orientation, open_image, orient

    image = open_image(image_bytes)
    image = orient(image, exif_orientation(image)).convert("RGB")
    image.thumbnail((side, side))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def embed_part(source: Source, raw, encoders, batch_size: int) -> dict:
    """Columns of one part (lists / arrays of equal length)."""
    import tensorflow as tf

    from trainer import preprocess
    from trainer.evaluators import encode_image_files
    from trainer.input_pipeline import image_preprocess, parse_fields

    if source.kind == "captions":
        keys, captions = zip(*raw)
        tokens = encoders.tokenizer.tokenize_numpy(list(captions))
        texts = encode_in_batches(encoders.encode_texts, chunks(tokens, batch_size), batch_size)
        n = len(keys)
        return {"key": list(keys), "caption": list(captions), "text_embedding": texts,
                "image_embedding": [None] * n, "thumbnail": [None] * n, "label": [None] * n,
                "source": [source.location] * n}
    if source.kind == "folder":
        images = encode_image_files(encoders.encode_images, raw, image_size=encoders.image_size,
                                    resize_size=encoders.resize_size, batch_size=batch_size)
        relative = [os.path.relpath(p, source.location) for p in raw]
        labels = [r.split(os.sep)[0] if os.sep in r else None for r in relative]
        thumbs = []
        for path in raw:
            with open(path, "rb") as f:
                thumbs.append(thumbnail(f.read()))
        n = len(raw)
        return {"key": relative, "caption": [None] * n, "text_embedding": [None] * n,
                "image_embedding": images, "thumbnail": thumbs, "label": labels, "source": list(raw)}
    serialized, paths = raw
    pp = preprocess.get_preprocess_fn(image_preprocess(encoders.image_size, encoders.resize_size, train=False))
    fields = ("image", "texts", "key")
    parsed = tf.data.Dataset.from_tensor_slices(serialized).map(lambda r: parse_fields(r, fields))
    raw_images, captions, keys = [], [], []
    for row in parsed.as_numpy_iterator():
        raw_images.append(row["image"])
        captions.append(row["texts"].decode("utf-8", "replace"))
        keys.append(row["key"].decode())
    pixels = (tf.data.Dataset.from_tensor_slices(serialized)
              .map(lambda r: pp(parse_fields(r, ("image",)))["image"], num_parallel_calls=tf.data.AUTOTUNE)
              .batch(batch_size))
    images = encode_in_batches(encoders.encode_images, pixels.as_numpy_iterator(), batch_size)
    tokens = encoders.tokenizer.tokenize_numpy(captions)
    texts = encode_in_batches(encoders.encode_texts, chunks(tokens, batch_size), batch_size)
    n = len(keys)
    return {"key": keys, "caption": captions, "text_embedding": texts, "image_embedding": images,
            "thumbnail": [thumbnail(b) for b in raw_images], "label": [None] * n,
            "source": [p.decode() for p in paths]}


def _table(columns: dict, dim: int):
    import pyarrow as pa

    # Variable-size lists, not fixed_size_list: pyarrow reads a null
    # fixed-size list back from Parquet as a zero-length one and then fails.
    vector = pa.list_(pa.float32())

    def vectors(values):
        if isinstance(values, np.ndarray):
            values = np.asarray(values, np.float32)
            offsets = pa.array(np.arange(0, values.size + 1, dim, dtype=np.int32))
            return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), pa.float32()))
        return pa.array(values, vector)

    return pa.table({
        "key": pa.array(columns["key"], pa.string()),
        "caption": pa.array(columns["caption"], pa.string()),
        "image_embedding": vectors(columns["image_embedding"]),
        "text_embedding": vectors(columns["text_embedding"]),
        "thumbnail": pa.array(columns["thumbnail"], pa.binary()),
        "label": pa.array(columns["label"], pa.string()),
        "source": pa.array(columns["source"], pa.string()),
    })


def export(workdir: str, source: Source, out_dir: str, *, step: Optional[int] = None,
           part_size: int = DEFAULT_PART_SIZE, batch_size: Optional[int] = None,
           say=lambda line: None, encoders=None) -> dict:
    """Writes the missing parts of ``source``'s embeddings into ``out_dir``; returns the manifest."""
    import pyarrow.parquet as pq

    from trainer import checkpoint

    encoders = encoders or checkpoint.Encoders(workdir, step)
    batch_size = batch_size or int(encoders.config.get("eval_batch_size", 64))
    dim = int(encoders.config.model.embed_dim)
    identity = {"workdir": os.path.abspath(workdir), "step": encoders.step, "source": source.describe(),
                "part_size": part_size, "embed_dim": dim}
    manifest_path = os.path.join(out_dir, MANIFEST)
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(manifest_path):
        from common import state_files as sf

        with open(manifest_path, "rb") as f:  # a damaged one is one line (DamagedFile) naming it
            previous = sf.parse(f.read(), manifest_path, sf.obj, "choose another --out, or delete it")
        differs = [k for k in identity if previous.get(k) != identity[k]]
        if differs:
            raise ValueError(f"{out_dir} holds embeddings of another export (different "
                             f"{', '.join(differs)}): choose another --out")
    with open(manifest_path, "w") as f:
        json.dump({**identity, "complete": False}, f, indent=2, sort_keys=True)

    total = source.num_rows()
    num_parts = max(1, -(-total // part_size))
    written = skipped = 0
    for index, raw in source.parts(part_size):
        path = os.path.join(out_dir, PART_PATTERN.format(index))
        if os.path.exists(path):
            skipped += 1
            continue
        start = time.time()
        columns = embed_part(source, raw, encoders, batch_size)
        tmp = path + ".tmp"
        pq.write_table(_table(columns, dim), tmp)
        os.replace(tmp, path)  # a part exists only once complete
        written += 1
        say(f"part {index + 1}/{num_parts}: {len(columns['key'])} rows ({time.time() - start:.0f}s)")
    rows = sum(pq.read_metadata(os.path.join(out_dir, PART_PATTERN.format(i))).num_rows
               for i in range(num_parts))
    if rows != total:
        raise RuntimeError(f"{out_dir}: the parts hold {rows} rows, the source has {total}")
    manifest = {**identity, "complete": True, "num_rows": rows, "num_parts": num_parts}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    manifest.update(written=written, skipped=skipped)
    return manifest


def read_embeddings(out_dir: str):
    """The export as one pyarrow Table, and its manifest; refuses an unfinished export."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.eval_data import EvalDataError

    manifest_path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(manifest_path):
        raise EvalDataError(f"{out_dir}: no {MANIFEST} (not a trainer.embed output)")
    from common import state_files as sf

    with open(manifest_path, "rb") as f:  # a damaged one is one line (DamagedFile) naming it
        manifest = sf.parse(f.read(), manifest_path, sf.obj, "run trainer.embed again")
    if not manifest.get("complete"):
        raise EvalDataError(f"{out_dir}: the export did not finish; run trainer.embed again to complete it")
    parts = [pq.read_table(os.path.join(out_dir, PART_PATTERN.format(i))) for i in range(manifest["num_parts"])]
    return pa.concat_tables(parts), manifest


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli.ArgumentParser(prog="python -m trainer.embed",
                                     description="Export image and text embeddings to Parquet.")
    parser.add_argument("workdir", help="the training run's workdir")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--shards", metavar="DATA_DIR", help="a shard directory (with --split)")
    what.add_argument("--images", metavar="FOLDER", help="a folder of images (recursive)")
    what.add_argument("--captions", metavar="FILE", help="one caption a line, or key<TAB>caption")
    parser.add_argument("--split", default="validation", help="shard split (default validation)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--part_size", type=int, default=DEFAULT_PART_SIZE, help="rows per Parquet file")
    parser.add_argument("--batch_size", type=int, default=None, help="default: the run's eval_batch_size")
    parser.add_argument("--allow_incomplete", action="store_true",
                        help="with --shards: read a corpus whose build did not commit (its newest version)")
    args = parser.parse_args(argv)

    from common import console
    from common.corpus_dir import IncompleteCorpus, require_completed

    if args.shards:
        try:
            require_completed(args.shards, args.allow_incomplete, "--allow_incomplete")
        except IncompleteCorpus as error:
            parser.exit(2, f"error: {error}\n")

    log = console.route_library_output("embed") if argv is None else "the log"
    try:
        import tensorflow as tf

        tf.config.set_visible_devices([], "GPU")
        source = (ShardSource(args.shards, args.split) if args.shards else
                  FolderSource(args.images) if args.images else CaptionSource(args.captions))
        manifest = export(args.workdir, source, args.out, step=args.step, part_size=args.part_size,
                          batch_size=args.batch_size, say=lambda line: print(line, flush=True))
    except Exception as error:
        from common.corpus_dir import DamagedFile
        from trainer.eval_data import EvalDataError
        from trainer.checkpoint import DamagedCheckpoint  # loaded already, by the time a checkpoint was read

        if isinstance(error, DamagedCheckpoint):  # one line naming the workdir and the step
            parser.exit(2, f"error: {error}\n")
        from trainer.shard_reader import damage_in

        return console.failure(damage_in(error) or error, "embedding export", log,
                               expected=(EvalDataError, FileNotFoundError, ValueError, DamagedFile))
    print(f"{manifest['num_rows']} rows in {manifest['num_parts']} part(s) ({manifest['written']} written, "
          f"{manifest['skipped']} already there) from step {manifest['step']}: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
