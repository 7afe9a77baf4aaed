"""``pipeline.readers.parquet``: a Parquet batch's rows as records, or as rejections with their reasons."""

import pyarrow as pa

from common.schema import Candidate
from pipeline.readers.parquet import batch_to_records
from pipeline.readers.rows import Rejection


def test_rows_missing_columns_or_bytes_are_rejected_with_reasons():
    table = pa.table({"url": ["a", "b", "c", "d"], "caption": ["x y z", None, "x y z", "x y z"],
                      "jpg": [b"img", b"img", None, b"img"], "status": ["success", "success", "success", "failed_to_download"]})
    (batch,) = table.to_batches()
    out = list(batch_to_records("f", batch, 1))
    assert isinstance(out[0], Candidate)
    assert [o.reason for o in out[1:]] == ["read/missing_caption", "read/no_image", "read/download_failed/failed_to_download"]
    no_caption = pa.table({"url": ["a"], "jpg": [b"img"]})
    (only,) = batch_to_records("f", no_caption.to_batches()[0], 1)
    assert isinstance(only, Rejection) and only.reason == "read/missing_column"
