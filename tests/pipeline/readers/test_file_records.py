"""Reading Parquet per row: every row of every readable file is accounted for, against the footer.

Real files on disk: invalid UTF-8 in a string column, a corrupt row group, image
columns of the wrong type, Hugging Face image structs, Spark-style directories,
non-Parquet files, binary and numeric urls.
"""

import collections

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to

from common.schema import Candidate
from pipeline.funnel.accounting import READ_NAMESPACE
from pipeline.readers.file_records import ReadCandidates
from pipeline.readers.input_files import list_input_files
from pipeline.readers.parquet import read_file as read_parquet_file
from pipeline.readers.rows import Rejection
from tests import images as made


def reasons(records):
    return collections.Counter("written" if isinstance(r, Candidate) else r.reason for r in records)


def string_column_with_bad_utf8(values):
    """A Parquet *string* column holding raw bytes (writers such as Spark do not validate)."""
    return pa.array(values, type=pa.binary()).view(pa.string())


def write_bad_utf8_file(path, rows=300, bad_row=150):
    captions = [f"caption number {i}".encode() for i in range(rows)]
    captions[bad_row] = b"\xff\xfe not utf-8"
    table = pa.table({
        "url": [f"https://e.x/{i}.jpg" for i in range(rows)],
        "caption": string_column_with_bad_utf8(captions),
        "jpg": [made.swatch(i) for i in range(rows)],
    })
    pq.write_table(table, path, row_group_size=100)
    return rows


def write_corrupt_second_row_group(path):
    """Two row groups of 20 rows; the second one's image pages overwritten with garbage."""
    rows = [{"url": f"https://e.x/rg{i}.jpg", "caption": f"row group row {i}", "jpg": made.swatch(i)} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=20)
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(1).column(2)
    data = bytearray(path.read_bytes())
    start = column.data_page_offset
    data[start : start + 16] = b"\xab" * 16  # the page header: the footer stays intact
    path.write_bytes(bytes(data))


def test_invalid_utf8_caption_rejects_one_row(tmp_path):
    path = tmp_path / "bad_caption.parquet"
    rows = write_bad_utf8_file(path)
    records = list(read_parquet_file(str(path)))
    assert len(records) == rows == pq.ParquetFile(path).metadata.num_rows
    assert reasons(records) == {"written": rows - 1, "read/caption_not_utf8": 1}
    (bad,) = [r for r in records if isinstance(r, Rejection)]
    assert bad.url == "https://e.x/150.jpg"


def test_corrupt_row_group_rejects_its_rows_and_keeps_the_others(tmp_path):
    path = tmp_path / "two_groups.parquet"
    write_corrupt_second_row_group(path)
    records = list(read_parquet_file(str(path)))
    assert reasons(records) == {"written": 20, "read/unreadable_row_group": 1}
    (lost,) = [r for r in records if isinstance(r, Rejection)]
    assert lost.url == f"{path}#row-group-1"
    assert dict(lost.detail) == {"unread_records": 20}  # one ledger line, standing for the group's 20 rows


@pytest.mark.parametrize("column", [
    pa.array([1, 2, 3], type=pa.int64()),
    pa.array(["not", "image", "bytes"]),
    pa.array([[1], [2], [3]], type=pa.list_(pa.int64())),
])
def test_image_column_of_another_type_rejects_each_row(tmp_path, column):
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"url": ["a", "b", "c"], "caption": ["x y z"] * 3, "jpg": column}), path)
    assert reasons(read_parquet_file(str(path))) == {"read/bad_image_column": 3}


def test_hugging_face_image_struct(tmp_path):
    path = tmp_path / "hf.parquet"
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": made.swatch(1), "path": "a.jpg"}, {"bytes": None, "path": "b.jpg"}, None], type=image_type)
    pq.write_table(pa.table({"url": ["u1", "u2", "u3"], "text": ["one two three"] * 3, "image": images}), path)
    records = list(read_parquet_file(str(path)))
    assert reasons(records) == {"written": 1, "read/no_image": 2}
    assert records[0].image == made.swatch(1)


def test_url_cells_that_are_not_text(tmp_path):
    path = tmp_path / "urls.parquet"
    urls = pa.array([b"https://e.x/ok.jpg", b"\xff\xfe", None], type=pa.binary())
    pq.write_table(pa.table({"url": urls, "caption": ["a b c"] * 3, "jpg": [made.swatch()] * 3}), path)
    records = list(read_parquet_file(str(path)))
    assert reasons(records) == {"written": 2, "read/url_not_text": 1}
    assert records[0].url == "https://e.x/ok.jpg"  # UTF-8 bytes become text, never "b'...'"
    numeric = tmp_path / "numeric_urls.parquet"
    pq.write_table(pa.table({"url": [1, 2], "caption": ["a b c"] * 2, "jpg": [made.swatch()] * 2}), numeric)
    assert reasons(read_parquet_file(str(numeric))) == {"read/url_not_text": 2}


def test_not_parquet_is_one_named_rejection(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"PAR1 not really")
    (record,) = read_parquet_file(str(path))
    assert record.reason == "read/unreadable_file" and record.url == str(path)


def make_input_tree(root):
    """Plain files, a Spark-style directory with bookkeeping files, and bad files; returns expected counts."""
    root.mkdir()
    expected = collections.Counter()
    expected["written"] += write_bad_utf8_file(root / "a.parquet") - 1
    expected["read/caption_not_utf8"] += 1
    write_corrupt_second_row_group(root / "b.parquet")
    expected["written"] += 20
    expected["read/unreadable_row_group"] += 1  # standing for the 20 rows of the second row group
    spark = root / "c.parquet"
    spark.mkdir()
    for part in range(2):
        rows = [{"url": f"https://e.x/s{part}-{i}.jpg", "caption": "spark part row", "jpg": made.swatch(i)} for i in range(7)]
        pq.write_table(pa.Table.from_pylist(rows), spark / f"part-0000{part}-abc.snappy.parquet")
    (spark / "_SUCCESS").write_bytes(b"")
    (spark / ".part-00000-abc.snappy.parquet.crc").write_bytes(b"crc")
    (spark / "_temporary").mkdir()
    (spark / "_temporary" / "part-9.parquet").write_bytes(b"half written")
    expected["written"] += 14
    (root / "d.parquet").write_bytes(b"not parquet at all")
    expected["read/unreadable_file"] += 1
    pq.write_table(pa.table({"url": pa.array([], pa.string()), "caption": pa.array([], pa.string()),
                             "jpg": pa.array([], pa.binary())}), root / "e.parquet")
    return expected


def test_beam_reader_accounts_for_every_row_against_the_footers(tmp_path):
    root = tmp_path / "in"
    expected = make_input_tree(root)
    pattern = str(root / "*.parquet")
    files = list_input_files(pattern)
    assert [f.split("/in/")[1] for f in files] == [
        "a.parquet", "b.parquet", "c.parquet/part-00000-abc.snappy.parquet",
        "c.parquet/part-00001-abc.snappy.parquet", "d.parquet", "e.parquet",
    ]
    footer_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files if not f.endswith("d.parquet"))
    p = beam.Pipeline(runner="FnApiRunner")
    read = p | ReadCandidates(pattern)
    labels = (
        (read["survivors"], read["rejected"])
        | beam.Flatten()
        | beam.Map(lambda r: "written" if isinstance(r, Candidate) else r.reason)
    )
    assert_that(labels, equal_to(list(expected.elements())))
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in
                result.metrics().query(MetricsFilter().with_namespace(READ_NAMESPACE))["counters"]}
    read_rows = footer_rows - 20  # the second row group of b.parquet cannot be decoded
    assert counters == {
        # the row group's one marker record counts as the 20 rows it stands for: the input is what the footers state
        "parquet_rows": footer_rows, "unreadable_files": 1,
        # what the footers state (1 for the unreadable file) == records read + the 20 counted unread
        "stated": footer_rows + 1, "stated_read": read_rows + 1, "stated_unread": 20, "unstated": 0,
        "unknown_loss_files": 0,
    }
    assert sum(expected.values()) == read_rows + 1 + 1


def test_a_directory_as_input_reads_its_data_files(tmp_path):
    root = tmp_path / "in"
    make_input_tree(root)
    files = list_input_files(str(root / "c.parquet"))
    assert [f.rsplit("/", 1)[1] for f in files] == ["part-00000-abc.snappy.parquet", "part-00001-abc.snappy.parquet"]


def test_a_reader_stopped_by_the_bytes_ends_its_file_with_one_record_and_other_errors_are_raised(monkeypatch):
    """``file_records``' last resort: what bytes provoke is one ``read/truncated_file`` counting the rest the
    file states; an error that is not the file's (the file system's, a storage client's) is the runner's."""
    import struct

    from pipeline import readers
    from pipeline.readers import file_records as read

    class Flaky(Exception):
        """Not an error bytes can provoke: a storage client's own."""

    def reader(error):
        class Reader:
            @staticmethod
            def read_file(path, columns):
                yield Rejection("k1", "read/no_image", url=f"{path}#1")
                raise error

            @staticmethod
            def expected_records(path, columns):
                return 5

        return Reader

    monkeypatch.setitem(readers.FORMATS, "stops", reader(struct.error("bad bytes")))
    records = list(read.file_records("stops", "x.bin"))
    assert [r.reason for r in records] == ["read/no_image", "read/truncated_file"]
    assert dict(records[1].detail) == {"unread_records": 4} and "error: bad bytes" in records[1].alt_text
    for error in (Flaky("503 from the store"), OSError("connection reset"), MemoryError()):
        monkeypatch.setitem(readers.FORMATS, "stops", reader(error))
        with pytest.raises(type(error)):
            list(read.file_records("stops", "x.bin"))
