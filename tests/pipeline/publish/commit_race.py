"""One process's side of two commits racing (``test_publish``): a module of its own, so that the spawned
processes import the commit and nothing else (not Beam, which the test module imports)."""

from pipeline.publish import commit


def commit_from(directory, data, expected, queue):
    try:
        commit.write(directory, data, expected)
        queue.put(data.decode())
    except commit.CommitConflict:
        queue.put("conflict")
