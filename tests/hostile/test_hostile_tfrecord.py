"""Hostile TFRecord files: malformed Example wire data, false lengths, lying TFDS shard lengths.

Each file mixes good records with one bad one. All are read in one child
process whose address space is limited (``read_harness``): one reason per
bad record, every good record kept, in order, within the memory and time
bounds, and the file's stated count reconciled by marker records.
"""

import json

import pytest

from hostile_inputs import _field, _varint, example_with, good, good_example, length_header, write_frames
from common import tfrecord_io as tfrecord
from read_harness import TEST_LIMITS, fates, read_bounded

TOO_LARGE = TEST_LIMITS["max_record_bytes"] + 1


def bytes_list_of_varint(value):
    """A ``Feature`` whose bytes_list holds a varint where a length-delimited value belongs."""
    return _field(1, _varint(1 << 3 | 0) + _varint(value))


def tfds_shard(directory, records, stated):
    """``corpus-train.tfrecord-00000-of-00001`` and a ``dataset_info.json`` stating its length."""
    info = {"name": "corpus", "splits": [{"name": "train", "shardLengths": [str(stated)]}]}
    (directory / "dataset_info.json").write_text(json.dumps(info))
    path = directory / "corpus-train.tfrecord-00000-of-00001"
    write_frames(path, records)
    return path


def write_cases(root):
    cases = {}

    def case(name, payloads, expected, tail=b"", directory=None):
        path = root / f"{name}.tfrecord"
        write_frames(path, payloads, tail)
        cases[name] = (path, expected)

    g = [good_example("tf", i) for i in range(4)]
    # An 83-byte record: a bytes value given as the varint 200,000,000 (read as a length: a 200 MB image).
    case("varint_as_bytes", [g[0], example_with("image", bytes_list_of_varint(200_000_000)), g[1]],
         ["written", "read/malformed_record", "written"])
    # Feature.bytes_list itself as a varint: a decoder that trusts the field number walks an int as a message.
    case("feature_kind_as_varint", [g[0], example_with("caption", _varint(1 << 3 | 0) + _varint(5)), g[1]],
         ["written", "read/malformed_record", "written"])
    # A packed float list of 5 bytes (not whole 4-byte floats).
    case("odd_float_list", [g[0], example_with("score", _field(2, _field(1, b"\x00" * 5))), g[1]],
         ["written", "read/malformed_record", "written"])
    # A record header claiming 2^40 bytes, with a valid length checksum, then the file ends.
    case("frame_length_2_40", [g[0], g[1]], ["written", "written", "read/truncated_file"],
         tail=length_header(1 << 40) + b"x" * 20)
    # A framed record over the cap: skipped (its length is checksummed, so the next one is found).
    big = tfrecord.encode_example({"url": "https://bad.example/big.jpg", "caption": "too big", "image": b"\xff" * TOO_LARGE})
    case("record_over_cap", [g[0], big, g[1]], ["written", "read/too_large", "written"])

    shard_dir = root / "tfds_lying"
    shard_dir.mkdir()
    path = tfds_shard(shard_dir, g[:3], stated=10**12)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])  # cut inside the third record
    cases["tfds_truncated_claims_10_12"] = (path, ["written", "written", "read/truncated_file"])

    fewer_dir = root / "tfds_fewer"
    fewer_dir.mkdir()
    cases["tfds_states_fewer"] = (tfds_shard(fewer_dir, g[:3], stated=1),
                                  ["written", "written", "written", "read/inconsistent_metadata"])
    return cases


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    cases = write_cases(tmp_path_factory.mktemp("tfrecord"))
    result = read_bounded([path for path, _ in cases.values()])
    return cases, result


def check(outcome, name):
    cases, result = outcome
    path, expected = cases[name]
    got = result["files"][str(path)]
    assert fates(got) == expected, got.get("records", got)[:6]
    assert result["peak_rss"] < result["limit"]
    return got["records"]


@pytest.mark.parametrize("name", ["varint_as_bytes", "feature_kind_as_varint", "odd_float_list"])
def test_malformed_example_is_one_record_and_the_next_is_read(outcome, name):
    records = check(outcome, name)
    assert [record[1] for record in records[::2]] == [good("tf", 0)[0], good("tf", 1)[0]]
    assert records[1][1].endswith("#2") and "not a tf.train.Example" in records[1][3]


def test_frame_length_2_40_with_valid_checksum_is_one_truncated_file(outcome):
    records = check(outcome, "frame_length_2_40")
    assert records[-1][2] == {"unread_records": "unknown"}  # a bare TFRecord file states no count


def test_record_over_the_cap_is_skipped_not_held(outcome):
    records = check(outcome, "record_over_cap")
    assert records[2][1] == good("tf", 1)[0]


def test_truncated_shard_whose_dataset_info_claims_10_12_costs_one_record(outcome):
    records = check(outcome, "tfds_truncated_claims_10_12")
    assert records[-1][2] == {"unread_records": 10**12 - 2}


def test_shard_holding_more_than_dataset_info_states_is_reconciled(outcome):
    records = check(outcome, "tfds_states_fewer")
    assert records[-1][2] == {"unread_records": 0, "unstated_records": 2}
