"""What the funnel should say about the input, judged in the launcher from its first data file.

A downloader that resized or re-encoded the images changes what the image
filters can see. img2dataset (by default) resizes to 256x256 and re-encodes
every image as JPEG, keeping the source size in ``original_width`` /
``original_height``: the size and aspect filters then judge that size
(``filters.record``), and the format filter can only judge the stored
format. URL lists (TSV, JSONL) carry no images at all. The notes say so,
per stage, in ``stats/funnel.json`` and the printed funnel.
"""

from __future__ import annotations

from typing import Dict, Optional

from pipeline import readers
from pipeline.readers import parquet as parquet_reader
from pipeline.readers.rows import SOURCE_SIZE_COLUMNS, Columns, Row
from pipeline.readers.webdataset import metadata_path

SNIFF_ROWS = 1000


def _first_data_file(pattern: str, override: Optional[str]):
    from pipeline.readers.input_files import list_input_files

    for path in list_input_files(pattern):
        if not readers.is_non_data(path):
            return path, readers.format_of(path, override)
    return None, None


def _metadata_rows(path: str, fmt: str, columns: Columns):
    """Up to ``SNIFF_ROWS`` rows that state sizes: a Parquet file's, or a shard's metadata Parquet."""
    from apache_beam.io.filesystems import FileSystems

    source = metadata_path(path) if fmt == "webdataset" else path
    if fmt not in ("parquet", "webdataset") or not FileSystems.exists(source):
        return []
    rows = []
    try:
        with FileSystems.open(source) as handle:
            for item in parquet_reader.parquet_batches(source, parquet_reader.open_parquet(handle), columns):
                if isinstance(item, Row):
                    rows.append(item.meta)
                if len(rows) >= SNIFF_ROWS:
                    break
    except Exception:
        return []
    return rows


def input_notes(pattern: str, override: Optional[str] = None, columns: Columns = Columns()) -> Dict[str, str]:
    """``{stage: note}`` for the funnel (empty when there is nothing to say)."""
    path, fmt = _first_data_file(pattern, override)
    if path is None:
        return {}
    notes = {}
    if fmt in ("tsv", "jsonl"):
        if columns.download:
            notes["read"] = f"{fmt} URL list without image bytes: the download stage fetches its images"
            return notes
        notes["read"] = (
            f"{fmt} URL list without image bytes: its rows are read/not_downloaded; build with --download, or "
            f"download them first (e.g. img2dataset --url_list FILE --input_format {fmt} --output_format webdataset) "
            "and build from that output"
        )
        return notes
    rows = _metadata_rows(path, fmt, columns)
    sized = [r for r in rows if all(isinstance(r.get(c), int) and r.get(c) > 0 for c in SOURCE_SIZE_COLUMNS)]
    if not sized:
        return notes
    resized = [r for r in sized if (r.get("width"), r.get("height")) != (r.get("original_width"), r.get("original_height"))]
    if resized:
        stored = sorted({f"{r.get('width')}x{r.get('height')}" for r in resized})
        notes["image_size"] = (
            f"the downloader resized stored images ({len(resized)} of the first {len(sized)} rows of {path}; "
            f"stored {', '.join(stored[:3])}{', ...' if len(stored) > 3 else ''}): size and aspect judge the "
            "source size (original_width/original_height), which the shards' original_* carry"
        )
    else:
        notes["image_size"] = "size and aspect judge the source size the input states (original_width/original_height)"
    notes["image_format"] = (
        "the input was written by a downloader (it states original_width/original_height); img2dataset re-encodes "
        "every image (JPEG by default, a PNG on the web is a JPEG here), so this stage judges the stored format, "
        "not the source's"
    )
    return notes
