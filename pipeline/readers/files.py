"""img2dataset's ``files`` output (its default in 1.47): ``00000/KEY.jpg|.txt|.json`` beside ``00000.parquet``.

The same samples as a WebDataset shard, as loose files in a folder instead of
a tar, and the same metadata-only Parquet listing every row (failed downloads
included). A shard is read by its Parquet file, together with its folder,
exactly as ``webdataset`` reads a tar with its Parquet; the folder's files
are never read on their own (``pipeline.read`` skips them).
"""

from __future__ import annotations

import posixpath
import re
from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from pipeline.readers.rows import Columns
from pipeline.readers.webdataset import read_shard, split_member_name


def folder_of(parquet_path: str) -> str:
    """``out/00000.parquet`` -> ``out/00000``."""
    return re.sub(r"\.parquet$", "", parquet_path)


def metadata_of_member(path: str) -> Optional[str]:
    """``out/00000/KEY.jpg`` -> ``out/00000.parquet`` (the shard it belongs to)."""
    folder = posixpath.dirname(path.replace("\\", "/"))
    return folder + ".parquet" if folder else None


def folder_files(folder: str):
    matched = FileSystems.match([FileSystems.join(folder, "*")])[0].metadata_list
    return sorted(meta.path for meta in matched)


def has_folder(parquet_path: str) -> bool:
    try:
        return bool(folder_files(folder_of(parquet_path)))
    except Exception:
        return False


def folder_samples(folder: str):
    """``(key, {field: bytes})`` per key, from the folder's files in name order."""
    key, sample = None, {}
    for path in folder_files(folder):
        member_key, field = split_member_name(posixpath.basename(path))
        if sample and member_key != key:
            yield key, sample
            sample = {}
        key = member_key
        with FileSystems.open(path) as handle:
            sample[field] = handle.read()
    if sample:
        yield key, sample


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    """``path`` is the shard's metadata Parquet; its folder holds the samples."""
    folder = folder_of(path)
    return read_shard(folder, path, folder_samples(folder), columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """Checked inside ``read_shard`` against the metadata Parquet's footer."""
    return None
