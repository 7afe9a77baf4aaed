"""``--dry_run=true`` with ``--runner DataflowRunner``: Dataflow's own translation of the job, in the default run.

The launcher's real path (``pipeline.build.launcher.main``) for the align
preset with everything that adds to the graph: an evaluation set,
``--download``, a pair model (``--model_score``) and the NSFW stage (align
scores at 0.5), ``--setup_file`` and ``--requirements_file`` as
docs/dataflow.md says. Beam's DataflowRunner accepts local input and output
paths in a dry run, so no GCS emulator is needed; nothing reaches the
network (``gs://`` appears only in Dataflow's staging and temp locations,
which a dry run names but does not touch).

The job's size must not grow with what the job reads: a second dry run
with 10,000 input files instead of 10 and an evaluation index of 10^5 rows
instead of the two images' gives the same graph. Embedding 10^5 evaluation
images would take minutes, so that run replaces the images' embedding
(``dedup.index_sets.load_index_sets``) with random rows of the embedder's
dimension; everything after it is the launcher's. Each dry run costs about
three CPU-seconds (building the graph, and Beam translating it twice). The
integration run repeats it with every path on ``gs://`` (the storage
emulator).
"""

import contextlib
import io
import os
import re

import pytest
from apache_beam.options import pipeline_options

import repo_root
from benchmarks.dry_run_size import random_index, url_lists
from dedup import index_sets
from filters import nsfw
from filters.presets import get_preset
from pipeline.build import dry_run, launcher
from pipeline.build import worker_requirements
from tests import images as made

DATAFLOW = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "us-central1",
            "--temp_location", "gs://my-bucket/tmp", "--dry_run=true"]
ALIGN = ["--preset", "align", "--download", "--model_score", "tests.pipeline.score_models:colour_words"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dry_run")
    evals = root / "eval"
    evals.mkdir()
    for i in range(2):
        (evals / f"{i}.jpg").write_bytes(made.noise(i, (64, 48)))
    requirements = root / "worker-requirements.txt"
    lock = os.path.join(repo_root.ROOT, "requirements", "lock.txt")
    requirements.write_text("\n".join(worker_requirements.worker_requirements(lock)))
    return {"root": root, "eval": str(evals), "requirements": str(requirements),
            "few": url_lists(str(root / "few"), 10), "many": url_lists(str(root / "many"), 10_000)}


@pytest.fixture(scope="module")
def dry_runs(inputs):
    """``{"few": (job, printed), "many": (job, printed)}``: ``launcher.main`` as a user runs it, twice."""
    runs = {}
    real = dry_run.build_job
    for files in ("few", "many"):
        jobs, printed = [], io.StringIO()

        def recording(*args, **kwargs):
            jobs.append(real(*args, **kwargs))
            return jobs[-1]

        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
            patch.setattr(dry_run, "build_job", recording)
            if files == "many":
                patch.setattr(index_sets, "load_index_sets", random_index(100_000))
            launcher.main(["--input", inputs[files], "--output", str(inputs["root"] / f"corpus-{files}"), *ALIGN,
                           "--eval_images", f"test={inputs['eval']}",
                           "--setup_file", os.path.join(repo_root.ROOT, "setup.py"),
                           "--requirements_file", inputs["requirements"], *DATAFLOW])  # returns: exit 0
        (job,) = jobs
        runs[files] = job, printed.getvalue()
    return runs


def test_dry_run_builds_the_dataflow_job_and_writes_nothing(inputs, dry_runs):
    job, out = dry_runs["few"]
    output = inputs["root"] / "corpus-few"
    assert not output.exists()
    assert job.graph_bytes < dry_run.GRAPH_LIMIT / 10 and job.request_bytes < dry_run.REQUEST_LIMIT / 100
    names = {t.unique_name for t in job.proto.components.transforms.values()}
    for stage in ("FirstPass/DownloadImages", "CorpusStages/ModelScore", "CorpusStages/NearDuplicatesOfEvalImages",
                  "SecondPass/WritePairsReport", "WriteBuildStats/ModelScoreStats"):
        assert stage in names
    assert nsfw.stage_enabled(get_preset("align").nsfw_threshold)  # so the first pass's judge scores NSFW
    # Data in the graph is a transform's payload (a beam.Create, a DoFn holding rows or vectors): none is large.
    assert job.largest_payloads[0][0] < 64 * 1024, job.largest_payloads
    assert {s.name for s in job.staged} >= {"requirements.txt", "workflow.tar.gz"}
    assert len(job.pinned) > 50 and "apache-beam==2.77.0" in job.pinned
    assert job.side_inputs and all(s.source != "?" for s in job.side_inputs)
    assert out.startswith("input: 10 file(s)")
    assert f"steps: {job.steps:,}" in out and "job graph:" in out and "side inputs:" in out
    assert f"pip installs {len(job.pinned)} pinned" in out and "workflow.tar.gz" in out
    assert f"writes: the build to {output}/versions/" in out and "downloaded images to" in out
    assert "local path(s) that Dataflow workers cannot reach" in out
    assert re.search(r"the evaluation index \(2 images: [1-9][0-9]* rows x 143,", out)


def test_the_job_does_not_grow_with_input_files_or_the_evaluation_index(dry_runs):
    (few, _), (many, out) = dry_runs["few"], dry_runs["many"]
    assert "input: 10,000 file(s)" in out and "100,000 rows" in out
    assert few.steps == many.steps
    # Flat: the few bytes apart are the index's row count in a stage note and the job's name.
    assert abs(few.graph_bytes - many.graph_bytes) < 256, (few.graph_bytes, many.graph_bytes)
    assert abs(few.request_bytes - many.request_bytes) < 256, (few.request_bytes, many.request_bytes)
    assert abs(few.largest_payloads[0][0] - many.largest_payloads[0][0]) < 64


def test_dry_run_is_a_dataflow_check():
    from pipeline.build.options import UsageError, beam_options

    with pytest.raises(UsageError, match="--dry_run=true checks a Dataflow launch"):
        beam_options(["--dry_run=true"])
    with pytest.raises(UsageError, match="true or false"):
        beam_options(["--dry_run=maybe"])
    assert beam_options(["--dry_run=false", *DATAFLOW[:-1]]).view_as(pipeline_options.TestOptions).dry_run is False
    # Beam's own checks of a Dataflow launch, in one line before the output is touched
    without_project = [arg for arg in DATAFLOW if arg != "my-project" and arg != "--project"]
    with pytest.raises(UsageError, match=r"^Missing required option: project\.$"):
        beam_options(without_project)


@pytest.mark.integration
def test_dry_run_of_the_docs_command_on_gcs(tmp_path, capsys):
    """docs/dataflow.md's command with every path on ``gs://`` (the storage emulator): nothing written there.

    The evaluation set is a folder on GCS, which is a prefix, not an object.
    """
    from apache_beam.io.filesystems import FileSystems

    from tests.pipeline import gcs_emulator

    def put(path, data: bytes):
        with FileSystems.create(path) as handle:
            handle.write(data)

    with gcs_emulator.running(str(tmp_path / "emulator.log")) as bucket:
        put(f"{bucket}/candidates/a.tsv", b"url\tcaption\nhttps://e.x/0.jpg\ta red picture\n")
        put(f"{bucket}/eval/0.jpg", made.noise(0, (64, 48)))
        launcher.main(["--input", f"{bucket}/candidates/*.tsv", "--output", f"{bucket}/corpus", *ALIGN,
                       "--eval_images", f"test={bucket}/eval", *DATAFLOW[:-3],
                       "--temp_location", f"{bucket}/tmp", "--dry_run=true"])
        out = capsys.readouterr().out
        assert "dry run: Dataflow job" in out and "local path" not in out
        # Nothing written to the output, and nothing staged (gs://BUCKET/** holds the two inputs only).
        assert sorted(m.path for m in FileSystems.match([f"{bucket}/**"])[0].metadata_list) == [
            f"{bucket}/candidates/a.tsv", f"{bucket}/eval/0.jpg"]


def test_a_job_over_dataflows_limit_is_one_line_and_exit_1(inputs, dry_runs, monkeypatch, capsys):
    job, _ = dry_runs["few"]
    monkeypatch.setattr(dry_run, "build_job", lambda *args: job._replace(graph_bytes=dry_run.GRAPH_LIMIT + 1))
    with pytest.raises(SystemExit) as exit:
        launcher.main(["--input", inputs["few"], "--output", str(inputs["root"] / "corpus-over"), *DATAFLOW])
    assert exit.value.code == launcher.EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: the job graph is 10,485,761 bytes, over Dataflow's limit of 10,485,760: Dataflow would "
                   "refuse this job (nothing was submitted)"]
    assert not (inputs["root"] / "corpus-over").exists()
