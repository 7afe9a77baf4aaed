"""Verdicts are conserved like records: one dropped on the way to the join fails the build, in one line.

A lost record breaks the funnel's conservation law; a lost verdict does not
(the record it would have rejected is written instead), so the key stages
count what they emit and the join what it receives (``pipeline.stages.verdicts``),
apart from the data, and the publication refuses a build whose counts differ.
"""


import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

import repo_root
from pipeline.build import launcher
from pipeline.stages import verdicts as verdicts_lib
from tests import images as made

SHARED = "a logo that many pages share"


def picture(i):
    return made.solid((240, 240), (i * 9 % 256, 60, 200 - i))


def candidates(directory):
    """Twelve images under one alt-text (images_per_text rejects all twelve), four ordinary pairs."""
    directory.mkdir()
    rows = [(f"https://e.x/logo{i}.jpg", SHARED, picture(i)) for i in range(12)]
    rows += [(f"https://e.x/p{i}.jpg", f"an ordinary photo number {i} here", picture(20 + i)) for i in range(4)]
    pq.write_table(pa.table({"url": [r[0] for r in rows], "caption": [r[1] for r in rows],
                             "jpg": [r[2] for r in rows]}), directory / "part.parquet")
    return directory / "*.parquet"


class LosingOneVerdict(verdicts_lib.JoinVerdicts):
    """What a runner that drops data does to one verdict between the stages and the join."""

    def expand(self, inputs):
        rows, verdicts, *measures = inputs
        kept = verdicts | "DropOneVerdict" >> beam.Filter(lambda kv: not kv[0].startswith(FIRST[0]))
        return super().expand((rows, kept, *measures))


FIRST = [""]


DRIVER = """
import sys
from pipeline.build import graph as build
from pipeline.build.launcher import main
from tests.pipeline.funnel import test_verdict_accounting as here
here.FIRST[0] = sys.argv.pop(1)
build.JoinVerdicts = here.LosingOneVerdict
sys.argv[0] = "pipeline.build"
main()
"""


def test_a_verdict_lost_before_the_join_fails_the_build_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    from common.schema import make_key

    pattern = candidates(tmp_path / "in")
    argv = ["--input", str(pattern), "--output", str(tmp_path / "out"), "--set", "vocab_size=0",
            "--set", "nsfw_threshold=1.0"]
    funnel = launcher.run(argv)
    assert funnel["stages"][11]["rejected"] == {"images_per_text/shared_text": 12}
    root = repo_root.ROOT
    victim = make_key("https://e.x/logo0.jpg", SHARED)[:8]  # one of the twelve keys
    done = subprocess.run([sys.executable, "-c", DRIVER, victim, *argv, "--overwrite",
                           "--log_file", str(tmp_path / "build.log")],
                          cwd=root, env=dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests")])),
                          capture_output=True, text=True, timeout=600)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(err) == 1 and "emitted 12 verdicts" in err[0] and "received 11" in err[0], err
    # Nothing was committed: the previous corpus stands.
    from corpus_paths import committed

    assert (committed(tmp_path / "out") / "stats" / "funnel.json").exists()


def test_the_counts_agree_on_an_honest_build(tmp_path):
    import json
    import os

    from common.corpus_dir import resolve
    from pipeline.publish.publisher import VERDICT_COUNTS

    pattern = candidates(tmp_path / "in")
    launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), "--set", "vocab_size=0",
                  "--set", "nsfw_threshold=1.0"])
    counts = json.load(open(os.path.join(resolve(str(tmp_path / "out")), VERDICT_COUNTS)))
    assert counts == {"emitted/corpus_filters": 12, "received": 12}
