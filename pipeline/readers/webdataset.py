"""img2dataset's WebDataset output: ``NNNNN.tar`` shards, with ``NNNNN.parquet`` beside them.

A shard holds one sample per successful download: consecutive members
``KEY.jpg`` (or ``.png``/``.webp``), ``KEY.txt`` (the caption) and ``KEY.json``
(url, status, original size, sha256, ...). The sample key is the member name
up to the first dot of its base name, as WebDataset splits it
(``a/b.c.jpg`` -> key ``a/b``, field ``c.jpg``). Failed downloads are not in
the tar at all: img2dataset lists every input row, failures included, in the
metadata-only Parquet file of the same name, so the shard is read together
with it:

- a tar sample becomes a record (its Parquet row, if any, merged under its
  ``.json``);
- a Parquet row whose download failed becomes ``read/download_failed/...``;
- a Parquet row that says ``success`` but has no sample in the tar is
  ``read/missing_from_shard``;
- a tar that ends early (truncated, corrupt header) adds one
  ``read/truncated_shard`` record naming where it stopped.

Every Parquet row is accounted for exactly once, checked against its footer.
"""

from __future__ import annotations

import json
import re
import tarfile
from typing import Dict, Iterator, Optional, Tuple

from apache_beam.io.filesystems import FileSystems

from common.schema import make_key
from filters import stages
from pipeline.readers import parquet as parquet_reader
from pipeline.readers.rows import Columns, Rejection, Row, shown, to_record

_KEY_AND_FIELD = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")


def split_member_name(name: str) -> Tuple[str, str]:
    """WebDataset's rule: key up to the first dot of the base name, field after it (lower-cased)."""
    found = _KEY_AND_FIELD.match(name)
    if not found:
        return name, ""
    return found.group(1), found.group(2).lower()


def metadata_path(tar_path: str) -> str:
    """img2dataset's metadata Parquet beside a shard: ``00000.tar`` -> ``00000.parquet``."""
    return re.sub(r"\.tar(\.gz)?$", "", tar_path) + ".parquet"


def tar_samples(handle) -> Iterator[Tuple[str, Dict[str, bytes]]]:
    """``(key, {field: bytes})`` per group of consecutive members with the same key (streamed)."""
    with tarfile.open(fileobj=handle, mode="r|*") as tar:
        key, sample = None, {}
        for member in tar:
            if not member.isfile():
                continue
            member_key, field = split_member_name(member.name)
            if sample and member_key != key:
                yield key, sample
                sample = {}
            key = member_key
            sample[field] = tar.extractfile(member).read()
        if sample:
            yield key, sample


def _metadata_rows(meta_path: str, columns: Columns):
    """The metadata Parquet's rows by img2dataset key, plus the rejections it already decided.

    Returns ``(by_key, decided, num_rows)``; ``num_rows`` is None without a file.
    """
    if not FileSystems.exists(meta_path):
        return {}, [], None
    try:
        with FileSystems.open(meta_path) as handle:
            parquet = parquet_reader.open_parquet(handle)
            num_rows = parquet.metadata.num_rows
            items = list(parquet_reader.parquet_batches(meta_path, parquet, columns))
    except Exception as error:
        return {}, [parquet_reader.unreadable_file(meta_path, error)], None
    by_key, decided = {}, []
    for item in items:
        if isinstance(item, Rejection):
            decided.append(item)
            continue
        status = shown(item.meta.get("status"))
        key = shown(item.meta.get("key"))
        if status in ("", "success") and key and key not in by_key:
            by_key[key] = item
        else:
            decided.append(item)
    if len(items) != num_rows:
        raise RuntimeError(f"{meta_path}: read {len(items)} rows, its footer says {num_rows}")
    return by_key, decided, num_rows


def sample_row(path: str, index: int, key: str, sample: Dict[str, bytes], listed: Optional[Row], columns: Columns) -> Row:
    """A tar sample (and its metadata row, if listed) as a ``Row``."""
    meta = dict(listed.meta) if listed is not None else {}
    meta.setdefault("key", key)
    if "json" in sample:
        try:
            found = json.loads(sample["json"])
            if isinstance(found, dict):
                meta.update({k: v for k, v in found.items() if v is not None})
        except ValueError:
            pass  # the .txt and the Parquet row may still carry url and caption
    url_field = next((name for name in columns.url if name in meta), None)
    if "txt" in sample:
        caption = sample["txt"]
    else:
        caption_field = next((name for name in columns.caption if name in meta), None)
        caption = meta.get(caption_field) if caption_field else None
    has_caption = "txt" in sample or any(name in meta for name in columns.caption)
    image = next((sample[f] for f in columns.image if f in sample), None)
    missing = tuple(n for n, ok in (("url", url_field is not None), ("caption", has_caption)) if not ok)
    return Row(
        position=f"{path}#{index}",
        url=meta.get(url_field) if url_field else None,
        caption=caption,
        image=image,
        meta=meta,
        missing=missing,
    )


def read_shard(path: str, meta_path: str, samples, columns: Columns = Columns()) -> Iterator[object]:
    """One shard's records: ``samples`` (an iterable of ``(key, fields)`` that may raise
    part-way) joined with the metadata Parquet at ``meta_path``."""
    by_key, decided, _ = _metadata_rows(meta_path, columns)
    for item in decided:
        yield item if isinstance(item, Rejection) else to_record(item, columns.carry)
    index = 0
    try:
        for key, sample in samples:
            index += 1
            yield to_record(sample_row(path, index, key, sample, by_key.pop(key, None), columns), columns.carry)
    except Exception as error:  # truncated or corrupt shard: what was read stays read
        where = f"{path}#after-{index}"
        yield Rejection(make_key(where, ""), stages.reason("read", "truncated_shard"), url=where, alt_text=repr(error)[:200])
    for key, row in sorted(by_key.items()):  # listed as downloaded, absent from the shard
        record = to_record(row, columns.carry)
        if isinstance(record, Rejection) and record.reason != "read/not_downloaded":
            yield record
        else:
            yield Rejection(record.key, stages.reason("read", "missing_from_shard"), url=record.url, alt_text=record.alt_text)


def _tar_file_samples(path: str):
    with FileSystems.open(path) as handle:
        yield from tar_samples(handle)


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    return read_shard(path, metadata_path(path), _tar_file_samples(path), columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """The tar says nothing of its count; its metadata Parquet is checked inside ``read_file``."""
    return None
