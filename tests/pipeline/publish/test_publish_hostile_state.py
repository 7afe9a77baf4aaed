"""The publication against state on disk that is not what it wrote: modes, half deletions, symbolic links."""

import os
import stat

from common.corpus_dir import COMMIT, MANIFEST, VERSIONS
from pipeline.publish import commit as commit_lib
from pipeline.publish import output_contract as output_lib
from pipeline.publish import publisher

VERSION = "20250101T000000Z-0123abcd"


def test_the_commit_object_is_readable_like_the_other_files(tmp_path):
    previous = os.umask(0o022)
    try:
        commit_lib.write(str(tmp_path), b"{}", commit_lib.read(str(tmp_path)).token)
        (tmp_path / "other").write_bytes(b"x")
    finally:
        os.umask(previous)
    mode = stat.S_IMODE(os.stat(tmp_path / COMMIT).st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "other").st_mode) == 0o644


def test_a_replaced_version_loses_its_manifest_first(tmp_path):
    prefix = f"{VERSIONS}/{VERSION}/"
    files = [prefix + name for name in ("a-train.tfrecord-00000-of-00001", "dataset_info.json", MANIFEST,
                                        "stats/funnel.json")]
    doomed = output_lib.replaced_files(files, "a", VERSION)
    assert doomed[0] == prefix + MANIFEST and len(doomed) > 2 and prefix + "a-train.tfrecord-00000-of-00001" in doomed


def test_no_file_is_deleted_through_a_linked_version_directory(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / MANIFEST).write_text("{}")
    (elsewhere / "a.tfrecord-00000-of-00001").write_bytes(b"precious")
    output = tmp_path / "out"
    (output / VERSIONS).mkdir(parents=True)
    link = output / VERSIONS / VERSION
    link.symlink_to(elsewhere, target_is_directory=True)
    (output / "own.txt").write_text("mine")
    relatives = output_lib.list_files(str(link))
    assert sorted(relatives) == ["a.tfrecord-00000-of-00001", MANIFEST]  # listed through the link...
    unlinked = output_lib.delete_files(str(output), [f"{VERSIONS}/{VERSION}/{f}" for f in relatives] + ["own.txt"])
    assert unlinked == [str(link)] and not os.path.lexists(link)  # ...but only the link is removed
    assert sorted(os.listdir(elsewhere)) == ["a.tfrecord-00000-of-00001", MANIFEST]
    assert not (output / "own.txt").exists()
    result = publisher.Published(VERSION, str(output), {}, False, VERSION, 1, unlinked=unlinked)
    assert any(line.startswith(f"{link} is a symbolic link") for line in publisher.report_lines(result))
