"""Hostile WebDataset shards and img2dataset ``files`` folders: tar tricks, bombs, deep JSON.

Each shard holds good samples around the bad one; they are read in one
child process under a memory limit (``read_harness``).
"""

import gzip
import io
import json
import tarfile

import pytest

from hostile_inputs import add_member, good, nested_json, sample_members, tar_bytes
from read_harness import TEST_LIMITS, fates, read_bounded

BOMB_MEMBER_BYTES = 320 << 20
FIVE = ["written"] * 5


def samples(name, count):
    return [member for i in range(count) for member in sample_members(name, i)]


def header(name, size):
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def raw_members(members):
    """Members as tar bytes (header, data, padding), without the end-of-archive blocks."""
    return b"".join(header(name, len(data)) + data + b"\0" * (-len(data) % 512) for name, data in members)


def tar_gz_with_bomb_member(name):
    """Sample 0, then sample 1 whose image member is ``BOMB_MEMBER_BYTES`` zeros, then sample 2; gzipped
    as members (one compressed megabyte of zeros repeated), so the file is a few hundred kB."""
    url, caption, _ = good(name, 1)
    after = [("00001.txt", caption.encode()), ("00001.json", json.dumps({"url": url, "caption": caption}).encode())]
    zeros = gzip.compress(b"\0" * (1 << 20))
    return (gzip.compress(raw_members(sample_members(name, 0)) + header("00001.jpg", BOMB_MEMBER_BYTES))
            + zeros * (BOMB_MEMBER_BYTES >> 20)
            + gzip.compress(raw_members(after + sample_members(name, 2)) + b"\0" * 1024))


def member_offsets(data):
    """Byte offset of each member's header in a plain tar."""
    offsets = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            offsets.append(member.offset)
    return offsets


def write_cases(root):
    cases = {}

    def case(file_name, data, expected):
        (root / file_name).write_bytes(data)
        cases[file_name] = (root / file_name, expected)

    members = samples("nested", 5)
    members[1 * 3 + 2] = ("00001.json", nested_json(30_000))  # 60 kB: within the cap, too deep to parse
    members[3 * 3 + 2] = ("00003.json", nested_json(100_000))  # 200 kB: over --read_max_line_bytes
    case("nested.tar", tar_bytes(members),
         ["written", "read/malformed_record", "written", "read/too_large", "written"])
    case("bomb.tar.gz", tar_gz_with_bomb_member("bomb"), ["written", "read/too_large", "written"])

    plain = tar_bytes(samples("checksum", 5))
    third = member_offsets(plain)[3 * 3]
    broken = bytearray(plain)
    broken[third + 148:third + 156] = b"0000000\0"  # sample 3's first header fails its checksum
    case("checksum.tar", bytes(broken), ["written"] * 3 + ["read/truncated_file"])

    plain = tar_bytes(samples("cut", 5))
    case("cut_at_header.tar", plain[:member_offsets(plain)[3 * 3]], ["written"] * 3 + ["read/truncated_file"])
    plain = tar_bytes(samples("cut_member", 5))
    case("cut_in_member.tar", plain[:member_offsets(plain)[3 * 3] + 600], ["written"] * 3 + ["read/truncated_file"] * 2)

    many = samples("many", 2)
    many[3:3] = [(f"00001.field{n}", b"") for n in range(TEST_LIMITS["max_record_bytes"] // 512 + 1)]
    case("many_members.tar", tar_bytes(many), ["written", "read/too_large"])

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, (member_name, data) in enumerate(samples("pax", 3)):
            extra = {"comment": "x" * (TEST_LIMITS["max_line_bytes"] * 2)} if member_name == "00001.jpg" else {}
            add_member(tar, member_name, data, pax_headers=extra)
    case("pax_header.tar", buffer.getvalue(), ["written", "read/too_large", "written"])

    # img2dataset's files output: a metadata-only Parquet and a folder; one image file over the cap.
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    folder = root / "00000"
    folder.mkdir()
    for i in range(3):
        url, caption, image = good("files", i)
        rows.append({"url": url, "caption": caption, "key": f"{i:05d}", "status": "success"})
        (folder / f"{i:05d}.jpg").write_bytes(image if i != 1 else b"\xff" * (TEST_LIMITS["max_record_bytes"] + 1))
        (folder / f"{i:05d}.txt").write_text(caption)
    pq.write_table(pa.Table.from_pylist(rows), root / "00000.parquet")
    cases["files"] = (root / "00000.parquet", ["written", "read/too_large", "written"])
    return cases


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    cases = write_cases(tmp_path_factory.mktemp("tar"))
    # One reading child for them all: the tars' format from their names, img2dataset's files layout named.
    result = read_bounded([p for p, _ in cases.values()], formats={cases["files"][0]: "files"})
    return cases, result


def check(outcome, name):
    cases, result = outcome
    path, expected = cases[name]
    got = result["files"][str(path)]
    assert fates(got) == expected, got.get("records", got)[:8]
    assert result["peak_rss"] < result["limit"]
    return got["records"]


def test_deep_and_large_json_members_reject_their_sample_and_the_rest_is_read(outcome):
    records = check(outcome, "nested.tar")
    assert [r[1] for r in records if r[0] == "written"] == [good("nested", i)[0] for i in (0, 2, 4)]
    assert "nested 30,000 deep" in records[1][3]
    assert records[3][1].endswith("nested.tar#4")  # no url: its .json was not read


def test_member_inflating_to_320_mb_is_too_large_and_never_held(outcome):
    records = check(outcome, "bomb.tar.gz")
    assert f"of {BOMB_MEMBER_BYTES:,} bytes" in records[1][3]


@pytest.mark.parametrize("name", ["checksum.tar", "cut_at_header.tar", "cut_in_member.tar"])
def test_lost_framing_is_a_truncated_file_record_not_a_quiet_end(outcome, name):
    records = check(outcome, name)
    assert records[-1][2] == {"unread_records": "unknown"}  # one marker for what follows; a tar states no count


def test_sample_cut_inside_a_member_is_rejected_not_written(outcome):
    records = check(outcome, "cut_in_member.tar")
    assert records[3][1].endswith("cut_in_member.tar#4") and "sample 00003 is cut short" in records[3][3]


def test_sample_of_many_empty_members_is_too_large(outcome):
    check(outcome, "many_members.tar")


def test_pax_header_over_the_cap_rejects_its_sample(outcome):
    check(outcome, "pax_header.tar")


def test_files_output_image_over_the_cap_is_too_large(outcome):
    check(outcome, "files")
