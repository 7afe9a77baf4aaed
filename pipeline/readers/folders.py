"""img2dataset's ``files`` output (its default in 1.47): ``00000/KEY.jpg|.txt|.json`` beside ``00000.parquet``.

The same samples as a WebDataset shard, as loose files in a folder instead of
a tar, and the same metadata-only Parquet listing every row (failed downloads
included). A shard is read by its Parquet file, together with its folder,
exactly as ``webdataset`` reads a tar with its Parquet (the same caps per
file and per sample, the same reasons); the folder's files are never read on
their own (``pipeline.readers.file_records`` skips them).
"""

from __future__ import annotations

import posixpath
import re
from typing import Iterator, Optional

from apache_beam.io.filesystems import FileSystems

from common.files import escape_glob, read_at_most
from pipeline.readers.limits import ReadLimits
from pipeline.readers.rows import Columns
from pipeline.readers.webdataset import TEXT_FIELDS, Sample, read_shard, split_member_name


def folder_of(parquet_path: str) -> str:
    """``out/00000.parquet`` -> ``out/00000``."""
    return re.sub(r"\.parquet$", "", parquet_path)


def metadata_of_member(path: str) -> Optional[str]:
    """``out/00000/KEY.jpg`` -> ``out/00000.parquet`` (the shard it belongs to)."""
    folder = posixpath.dirname(path.replace("\\", "/"))
    return folder + ".parquet" if folder else None


def folder_files(folder: str):
    matched = FileSystems.match([FileSystems.join(escape_glob(folder), "*")])[0].metadata_list
    return sorted(meta.path for meta in matched)


def has_folder(parquet_path: str) -> bool:
    try:
        return bool(folder_files(folder_of(parquet_path)))
    except Exception:
        return False


def folder_samples(folder: str, limits: ReadLimits = ReadLimits()) -> Iterator[Sample]:
    """One ``Sample`` per key, from the folder's files in name order, with the caps of a tar sample.

    A file's size comes from the file system's listing and is checked again
    as it is read (at most one byte past its cap is ever read).
    """
    matched = FileSystems.match([FileSystems.join(escape_glob(folder), "*")])[0].metadata_list
    key, fields, held, problem, started = None, {}, 0, None, False
    for meta in sorted(matched, key=lambda m: m.path):
        name = posixpath.basename(meta.path)
        member_key, field = split_member_name(name)
        if started and member_key != key:
            yield Sample(key, fields, problem)
            fields, held, problem = {}, 0, None
        key, started = member_key, True
        text = field in TEXT_FIELDS
        cap, flag = (limits.max_line_bytes, "line") if text else (limits.max_record_bytes, "record")
        data = b""
        if meta.size_in_bytes <= cap and held + meta.size_in_bytes <= limits.max_record_bytes:
            with FileSystems.open(meta.path) as handle:
                data = read_at_most(handle, cap + 1)
        size = max(meta.size_in_bytes, len(data))
        held += size
        if size > cap:
            problem = problem or ("too_large", f"file {name} of {size:,} bytes, over --read_max_{flag}_bytes {cap:,}")
        elif held > limits.max_record_bytes:
            problem = problem or ("too_large", f"sample {key} of over {limits.max_record_bytes:,} bytes (--read_max_record_bytes)")
        else:
            fields[field] = data
    if started:
        yield Sample(key, fields, problem)


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    """``path`` is the shard's metadata Parquet; its folder holds the samples."""
    folder = folder_of(path)
    return read_shard(folder, path, folder_samples(folder, columns.limits), columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """Checked inside ``read_shard`` against the metadata Parquet's footer."""
    return None
