"""A local GCS for the tests: ``gcp-storage-emulator`` (PyPI, pinned in requirements/lock.txt) on loopback.

Beam's GCS filesystem and ``google-cloud-storage`` follow ``STORAGE_EMULATOR_HOST``
(anonymous credentials, no project). Beam first looks for Google credentials
and, finding none, retries for ~25 s before it connects anonymously; the
fixture records "none found" in Beam's credential cache up front, which is
what that search ends with on a machine without credentials.

The emulator writes an object's ``mediaLink`` (the URL the client downloads
it from) with its name as it is, where GCS percent-encodes it: a ``?`` in a
name (an ``--output`` with glob characters) would end the URL's path. It is
run with that one link encoded as GCS encodes it (``_SERVE``).

The emulator ignores ``ifGenerationMatch`` preconditions: the commit's
compare-before-write (``pipeline.publish.commit``) is what refuses a second commit
on it; the precondition itself guards the last race on real GCS.
"""

import contextlib
import os
import socket
import subprocess
import sys
import time

BUCKET = "corpus-test"


_SERVE = """
import sys
import urllib.parse

from gcp_storage_emulator.handlers import objects

made = objects._make_object_resource


def encoded(base_url, bucket_name, object_name, *args, **kwargs):
    resource = made(base_url, bucket_name, object_name, *args, **kwargs)
    link = resource["mediaLink"]
    start = link.index(f"/o/{object_name}?generation=") + 3
    resource["mediaLink"] = link[:start] + urllib.parse.quote(object_name, safe="") + link[start + len(object_name):]
    return resource


objects._make_object_resource = encoded
from gcp_storage_emulator.__main__ import main

main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(log_path: str):
    """Starts the emulator (in memory, one bucket), points Beam at it, stops it afterwards."""
    import gcp_storage_emulator  # noqa: F401  (installed by scripts/setup_env.sh; fail loudly if not)
    from apache_beam.internal.gcp import auth

    port = _free_port()
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVE, "start", "--host", "127.0.0.1", "--port", str(port),
             "--in-memory", "--default-bucket", BUCKET], stdout=log, stderr=subprocess.STDOUT)
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    saved_auth = (auth._Credentials._credentials_init, auth._Credentials._credentials)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, open(log_path).read()
                time.sleep(0.1)
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        auth._Credentials._credentials_init, auth._Credentials._credentials = True, None
        yield f"gs://{BUCKET}"
    finally:
        auth._Credentials._credentials_init, auth._Credentials._credentials = saved_auth
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved
        server.terminate()
        server.wait(timeout=30)
