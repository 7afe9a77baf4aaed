"""``pipeline.stages.light_rows``: the rows between stages have deterministic schema coders (the shuffles key on them)."""

import apache_beam as beam

from common.schema import make_key
from pipeline.stages.light_rows import HashRow, LightRow


def test_rows_between_stages_have_deterministic_schema_coders():
    light = LightRow(make_key("u", "three word caption"), "u", "three word caption", "", True, "a", "", 300, 200, "JPEG",
                     "part.parquet", "parquet", 0)
    for row in (light, HashRow("k", "ab" * 32, "")):
        coder = beam.coders.registry.get_coder(type(row))
        assert isinstance(coder, beam.coders.RowCoder) and coder.is_deterministic()
        decoded = coder.decode(coder.encode(row))
        assert type(decoded) is type(row) and decoded == row
