"""Publishing through Beam's GCS filesystem (``gs://``) against a storage emulator on loopback.

The same cases as on local files (``publish_cases``): a commit, a build stopped between its shards and
its commit, the resume, ``--overwrite`` after a failed rebuild, two concurrent builds, outputs named with glob
characters. 10-12 s
each on an idle 2-core machine (about a minute under load): every object is an HTTP request to the emulator.
"""

import pytest

from tests.pipeline import gcs_emulator, publish_cases
from tests.pipeline.build.test_build_safety import write_candidates


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    with gcs_emulator.running(str(tmp_path_factory.mktemp("emulator") / "emulator.log")) as root:
        yield root


@pytest.fixture
def pattern(tmp_path):
    return write_candidates(tmp_path / "in", rows=12)


def test_commit_crash_and_resume_on_gcs(bucket, pattern):
    publish_cases.commit_and_resume(pattern, f"{bucket}/resume")


# The local-file twins of these two run in the default run (test_publish.py); on the emulator, in CI's integration run.
@pytest.mark.integration
def test_failed_rebuild_leaves_the_previous_corpus_on_gcs(bucket, pattern, monkeypatch):
    publish_cases.failed_rebuild_keeps_the_corpus(pattern, f"{bucket}/failed", monkeypatch)


@pytest.mark.integration
def test_concurrent_builds_on_gcs(bucket, pattern):
    publish_cases.concurrent_builds(pattern, f"{bucket}/concurrent")


@pytest.mark.integration
def test_glob_characters_in_the_output_on_gcs(bucket, pattern):
    publish_cases.glob_characters_in_the_output(pattern, f"{bucket}/glob")
