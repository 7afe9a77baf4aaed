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
- a sample over the caps (a member over ``--read_max_record_bytes``, a
  ``.json``/``.txt`` over ``--read_max_line_bytes``, or all its members
  together over ``--read_max_record_bytes``) is ``read/too_large``, never
  held; a sample whose ``.json`` is not a JSON object (or nests deeper than
  ``MAX_JSON_DEPTH``) is ``read/malformed_record``; either way the next
  sample is read;
- a tar whose framing is lost (truncated, a header that fails its checksum,
  a ``.tar.gz`` cut short) adds one ``read/truncated_file`` marker record
  naming where it stopped, after the sample it was in (rejected as
  ``read/truncated_file`` too if the break cut one of its members) (a tar states no count: the metadata Parquet's
  rows that were not reached are each ``read/missing_from_shard``).

Every Parquet row is accounted for exactly once: a row, or a marker record
of the metadata Parquet's own reader (``pipeline.readers.parquet``) for rows
it could not read. The tar is read with ``pipeline.readers.tar_stream``, not
``tarfile`` (which ends quietly at a bad header).
"""

from __future__ import annotations

import re
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

from apache_beam.io.filesystems import FileSystems

from common.schema import make_key
from filters import stages
from pipeline.readers import parquet as parquet_reader
from pipeline.readers import tar_stream
from pipeline.readers.limits import ReadLimits, load_json
from pipeline.readers.losses import malformed, marker
from pipeline.readers.rows import BAD_CELL, Columns, Rejection, Row, decided, shown, text_of, to_record
from pipeline.readers.streams import StreamError, open_input

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


#: Members parsed as text: capped by ``--read_max_line_bytes``.
TEXT_FIELDS = ("json", "txt")


class Sample(NamedTuple):
    """A group of consecutive members with one key; ``problem`` is ``(reason, note)`` for a sample not kept whole."""

    key: str
    fields: Dict[str, bytes]
    problem: Optional[Tuple[str, str]] = None


def tar_samples(handle, limits: ReadLimits = ReadLimits()) -> Iterator[Sample]:
    """One ``Sample`` per group of consecutive members with the same key (streamed).

    A sample holds at most ``max_record_bytes`` (each member's 512-byte
    header counted, so a sample of a million empty members is too large
    too); a member over its cap is read through, not kept. Where the
    archive's framing is lost, the sample being read is yielded (as it is if
    the break came at a header, so its members were read whole; with the
    problem ``truncated_file`` if it came inside a member) and
    ``TarError``/``StreamError`` is raised.
    """
    key, fields, held, problem, started = None, {}, 0, None, False
    try:
        for member in tar_stream.members(handle, limits.max_line_bytes):
            if not member.regular:
                continue
            member_key, field = split_member_name(member.name)
            if started and member_key != key:
                yield Sample(key, fields, problem)
                fields, held, problem = {}, 0, None
            key, started = member_key, True
            text = field in TEXT_FIELDS
            cap, flag = (limits.max_line_bytes, "line") if text else (limits.max_record_bytes, "record")
            held += member.size + tar_stream.BLOCK
            if member.problem is not None:
                problem = problem or (member.problem[0], f"{member.name}: {member.problem[1]}")
            elif member.size > cap:
                problem = problem or ("too_large", f"member {member.name} of {member.size:,} bytes, "
                                                   f"over --read_max_{flag}_bytes {cap:,}")
            elif held > limits.max_record_bytes:
                problem = problem or ("too_large", f"sample {key} of over {limits.max_record_bytes:,} bytes "
                                                   "(--read_max_record_bytes)")
            else:
                fields[field] = member.read()
    except (tar_stream.TarError, StreamError) as error:
        if started:  # the sample being read: kept if its members were read whole, else rejected by name
            whole = isinstance(error, tar_stream.TarError) and error.at_header
            yield Sample(key, fields, problem if whole else ("truncated_file", f"sample {key} is cut short: {error}"))
        raise
    if started:
        yield Sample(key, fields, problem)


def _metadata_records(meta_path: str, columns: Columns, by_key: Dict[str, Row]) -> Iterator[object]:
    """The records the metadata Parquet decides by itself, streamed; its other rows go to ``by_key``.

    Decided: failed downloads, duplicate keys, the Parquet reader's marker
    records (an unreadable file or row group), each once. ``by_key`` gets the
    rows of successful downloads by img2dataset key, to join with the tar.
    """
    if not FileSystems.exists(meta_path):
        return
    try:
        with FileSystems.open(meta_path) as handle:
            for item in parquet_reader.parquet_batches(meta_path, parquet_reader.open_parquet(handle), columns):
                if isinstance(item, Rejection):
                    yield item
                    continue
                status = shown(item.meta.get("status"))
                key = shown(item.meta.get("key"))
                if status in ("", "success") and key and key not in by_key:
                    by_key[key] = item
                else:
                    yield decided(item.position, lambda: to_record(item, columns.carry))
    except Exception as error:  # no footer (or it failed later): what was read stays read
        yield parquet_reader.unreadable_file(meta_path, error)


def sample_row(path: str, index: int, key: str, sample: Dict[str, bytes], listed: Optional[Row], columns: Columns,
               described: Optional[dict] = None) -> Row:
    """A tar sample (and its metadata row, if listed) as a ``Row``; ``described``: its parsed ``.json``."""
    meta = dict(listed.meta) if listed is not None else {}
    meta.setdefault("key", key)
    meta.update({k: v for k, v in (described or {}).items() if v is not None})
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


def _text_or_empty(value) -> str:
    return (text_of(value) or "") if value is not BAD_CELL else ""


def sample_record(path: str, index: int, sample: Sample, listed: Optional[Row], columns: Columns):
    """One tar sample (with its metadata row, if listed) -> its ``Candidate`` or ``Rejection``."""
    position = f"{path}#{index}"
    described = None
    if "json" in sample.fields:
        try:
            described = load_json(sample.fields["json"])
        except ValueError as error:  # bad JSON, not UTF-8, too deep
            described = error
        if not isinstance(described, dict):
            return malformed(position, f"{sample.key}.json is not a JSON object: {described!r}"[:300])
    row = sample_row(path, index, sample.key, sample.fields, listed, columns, described)
    if sample.problem is None:
        return to_record(row, columns.carry)
    reason, note = sample.problem
    url = _text_or_empty(row.url)
    caption = _text_or_empty(row.caption)
    key = make_key(url, caption) if url else make_key(position, "")
    return Rejection(key, stages.reason("read", reason), url=url or position, alt_text=note[:300])


def read_shard(path: str, meta_path: str, samples, columns: Columns = Columns()) -> Iterator[object]:
    """One shard's records: ``samples`` (an iterable of ``Sample`` that may raise ``TarError`` or
    ``StreamError`` part-way) joined with the metadata Parquet at ``meta_path``."""
    by_key: Dict[str, Row] = {}
    yield from _metadata_records(meta_path, columns, by_key)
    index = 0
    try:
        for sample in samples:
            index += 1
            listed = by_key.pop(sample.key, None)
            yield decided(f"{path}#{index}", lambda: sample_record(path, index, sample, listed, columns))
    except (tar_stream.TarError, StreamError) as error:  # what was read stays read
        where = f"{path}#after-{index}"
        yield marker(where, "truncated_file", f"{error}; a tar states no count", None)
    for key, row in sorted(by_key.items()):  # listed as downloaded, absent from the shard
        record = decided(row.position, lambda: to_record(row, columns.carry))
        if isinstance(record, Rejection) and record.reason != "read/not_downloaded":
            yield record
        else:
            yield Rejection(record.key, stages.reason("read", "missing_from_shard"), url=record.url, alt_text=record.alt_text)


def _tar_file_samples(path: str, limits: ReadLimits):
    with open_input(path) as handle:
        yield from tar_samples(handle, limits)


def read_file(path: str, columns: Columns = Columns()) -> Iterator[object]:
    return read_shard(path, metadata_path(path), _tar_file_samples(path, columns.limits), columns)


def expected_records(path: str, columns: Columns = Columns()) -> Optional[int]:
    """The tar says nothing of its count; its metadata Parquet is checked inside ``read_file``."""
    return None
