"""The model-score stage in a build: the cuts on 2 workers, the report's section, off by default, no network, one-line errors.

The model is ``tests.pipeline.score_models:colour_words`` (a registered pair
model: mean colour against the colour the alt-text names), named as a user
names their own, so each worker process imports it. The scores a build
records are checked against a trained checkpoint's ``trainer.embed``
cosines in ``tests/trainer/test_pair_score.py``.
"""

import glob
import json
import os
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import repo_root
from common.schema import make_key
from corpus_paths import committed
from filters import model_score, score_cut
from filters.text import normalize_text
from pipeline.audit import auditor as audit
from pipeline.build import launcher
from tests import images as made
from tests.pipeline import score_models
from tests.pipeline.build.test_build_safety import cli, write_candidates

ROOT = repo_root.ROOT
MODEL = "tests.pipeline.score_models:colour_words"
QUICK = ["--set", "vocab_size=0", "--set", "nsfw_threshold=1.0", "--set", "min_shorter_side=0"]
SHARED = "a red thing seen here"  # on 12 distinct pictures: images_per_text rejects it (more than 10)


def write_pairs(directory, rows=150, files=3, seed=0):
    """Parquet parts of pictures of one colour and alt-texts that name it, another colour or none.

    Some pictures and alt-texts repeat under other URLs (equal scores, different keys: ties the cut breaks by
    key), and one alt-text is on 12 pictures (images_per_text rejects it). Returns ``[(key, image, text)]``.
    """
    rng = np.random.default_rng(seed)
    names = list(score_models.COLOURS)
    pairs = []
    for i in range(rows):
        shown = names[i % len(names)]
        said = rng.choice([shown, names[(i * 3 + 1) % len(names)], "plain"], p=[0.5, 0.3, 0.2])
        repeat = i % 10 == 0 and i > 0  # every tenth: the last pair again, under another URL
        image = pairs[-1][2] if repeat else made.noisy_colour(score_models.COLOURS[shown], rng)
        caption = pairs[-1][3] if repeat else f"a {said} thing number {i}"
        pairs.append((f"https://e.x/{i}.jpg", caption, image, caption))
    for j in range(12):
        pairs.append((f"https://e.x/shared/{j}.jpg", SHARED, made.noisy_colour(score_models.COLOURS[names[j % 5]], rng), SHARED))
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        part = pairs[f::files]
        pq.write_table(pa.table({"url": [p[0] for p in part], "caption": [p[1] for p in part],
                                 "jpg": [p[2] for p in part]}), directory / f"part-{f}.parquet")
    return [(make_key(url, caption), image, normalize_text(caption)) for url, caption, image, _ in pairs]


def expected_verdicts(pairs, threshold, fraction):
    """key -> the stage's reason, from the model's scores in this process and a plain sort."""
    scorer = model_score.PairScorer(MODEL)
    scores = scorer.score([image for _, image, _ in pairs], [text for _, _, text in pairs])
    keys = [key for key, _, _ in pairs]
    ranked = sorted(range(len(pairs)), key=lambda i: (float(scores[i]), score_cut.key_hash(keys[i])))
    top = set(ranked[len(pairs) - score_cut.kept_count(len(pairs), fraction):])
    verdicts = {}
    for i, key in enumerate(keys):
        if scores[i] < threshold:
            verdicts[key] = score_cut.BELOW_THRESHOLD
        elif i not in top:
            verdicts[key] = score_cut.OUTSIDE_TOP_FRACTION
    return verdicts, dict(zip(keys, map(float, scores)))


def ledger(output):
    rows = []
    for path in sorted(glob.glob(os.path.join(str(committed(output)), "stats", "rejected", "*.jsonl"))):
        rows += [json.loads(line) for line in open(path)]
    return rows


# In the default run the job runs in this process; CI's integration run repeats the same checks on 2 worker
# processes (each pair scored on whichever worker reads it; each process starts Beam, Pillow and the model).
RUNNERS = {"in_process": [], "two_workers": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]}


@pytest.fixture(scope="module", params=["in_process", pytest.param("two_workers", marks=pytest.mark.integration)])
def two_worker_build(request, tmp_path_factory):
    """The pairs built with both cuts, in process or on 2 worker processes: (pairs, output, funnel)."""
    root = tmp_path_factory.mktemp("scored")
    pairs = write_pairs(root / "in")
    os.environ["PYTHONPATH"] = ROOT  # the worker processes import the model's module
    funnel = launcher.run(["--input", str(root / "in" / "*.parquet"), "--output", str(root / "out"), *QUICK,
                           "--model_score", MODEL, "--set", "model_score_top_fraction=0.6", *RUNNERS[request.param]])
    return pairs, root / "out", funnel


def test_the_cuts_keep_the_stated_fraction_on_every_worker(two_worker_build):
    pairs, output, funnel = two_worker_build
    want, scores = expected_verdicts(pairs, -1.0, 0.6)
    stage = next(row for row in funnel["stages"] if row["stage"] == "model_score")
    assert stage["in"] == len(pairs) == 162
    assert stage["out"] == 97 == round(0.6 * 162)  # exactly; ties (repeated pictures and alt-texts) broken by key
    assert stage["rejected"] == {score_cut.OUTSIDE_TOP_FRACTION: 65}
    got = {row["key"]: row["reason"] for row in ledger(output) if row["reason"].startswith("model_score/")}
    assert got == want  # the very pairs, on whichever worker each was scored
    assert len(set(scores.values())) < len(scores)  # there were ties to break
    for row in ledger(output):  # every rejected pair carries the score it was judged by
        assert row["model_score"] == pytest.approx(scores[row["key"]], abs=1e-6)
    assert "scored by colour words" in stage["note"] and "the top 0.6 of the scored pairs" in stage["note"]


def test_the_distribution_has_the_cut_and_what_the_score_alone_would_catch(two_worker_build):
    pairs, output, funnel = two_worker_build
    entry = json.loads((committed(output) / "stats" / "distributions.json").read_text())["model_score"]
    assert sum(entry["counts"]) == entry["scored"] == len(pairs)
    assert entry["threshold"] is None and entry["keep"] == ">=" and entry["cut"] == entry["fraction_cut"]
    want, scores = expected_verdicts(pairs, -1.0, 0.6)
    assert max(scores[k] for k in want) <= entry["cut"] <= min(s for k, s in scores.items() if k not in want)
    shared = [make_key(f"https://e.x/shared/{j}.jpg", SHARED) for j in range(12)]
    cut_too = sum(1 for key in shared if key in want)
    assert 0 < cut_too < 12  # both kinds of overlap happen in this input
    assert entry["other_stages"]["images_per_text"] == {
        "counts": entry["other_stages"]["images_per_text"]["counts"], "rejected": 12, "also_cut_by_score": cut_too}
    assert sum(entry["other_stages"]["images_per_text"]["counts"]) == 12
    assert entry["rejected_also_elsewhere"] == cut_too


def test_the_report_shows_the_section(two_worker_build):
    _, output, funnel = two_worker_build
    html = open(audit.render_report(str(output))).read()
    section = html[html.index('<h2 id="model-score">'):]
    assert "Model score</h2>" in section and "colour words" in section
    entry = json.loads((committed(output) / "stats" / "distributions.json").read_text())["model_score"]
    threshold = score_cut.otsu_threshold(entry)
    assert f"<code>--set model_score_threshold={threshold:g}</code> cuts there" in section
    assert section.count('<img src="data:image/png;base64,') >= 1  # the histogram with both cuts
    assert "What the score alone would have caught" in section and "<code>images_per_text</code>" in section
    cards = section[section.index("Rejected by the score"):section.index("Other stages")]
    assert cards.count('class="card"') >= 2 and cards.count("cosine ") >= 2
    assert '<img src="data:image/jpeg;base64,' in cards  # the rejected pairs' thumbnails, with their alt-texts
    assert "Other stages&#x27; rejects" in section or "Other stages' rejects" in section


def test_the_stage_is_off_by_default(tmp_path):
    pattern = write_candidates(tmp_path / "in", rows=4)
    funnel = launcher.run(["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK])
    assert "model_score" not in [row["stage"] for row in funnel["stages"]]
    stats = committed(tmp_path / "out") / "stats"
    assert "model_score" not in json.loads((stats / "distributions.json").read_text())
    assert "model_score" not in (stats / "rejected_samples.jsonl").read_text()
    assert 'id="model-score"' not in open(audit.render_report(str(tmp_path / "out"))).read()


def test_the_stage_needs_no_network(tmp_path, monkeypatch):
    """Scoring in a build (in process) with every connection off the machine refused."""
    refused = []
    connect = socket.socket.connect

    def local_only(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("localhost", "127.0.0.1", "::1") and sock.family != socket.AF_UNIX:
            refused.append(address)
            raise OSError(f"test: no network ({address})")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    pairs = write_pairs(tmp_path / "in", rows=40, files=1)
    funnel = launcher.run(["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out"), *QUICK,
                           "--model_score", MODEL, "--set", "model_score_threshold=0.0",
                           "--set", "model_score_top_fraction=0.5"])
    assert refused == []
    want, _ = expected_verdicts(pairs, 0.0, 0.5)
    got = {row["key"]: row["reason"] for row in ledger(tmp_path / "out") if row["reason"].startswith("model_score/")}
    assert got == want and set(want.values()) == {score_cut.BELOW_THRESHOLD, score_cut.OUTSIDE_TOP_FRACTION}


def test_cuts_without_a_model_and_bad_models_are_usage_errors(tmp_path):
    pattern = str(write_candidates(tmp_path / "in", rows=2))
    base = ["--input", pattern, "--output", str(tmp_path / "out"), *QUICK]
    cases = [
        (["--set", "model_score_top_fraction=0.3"], r"^model_score_top_fraction cut by a model's scores: name the "
                                                    r"model with --model_score"),
        (["--model_score_arg", "workdir=x"], r"^--model_score_arg needs --model_score$"),
        (["--model_score", "clip"], r"^--model_score clip: unknown pair model 'clip'; known: .*checkpoint"),
        (["--model_score", "no_such_module:clip"], r"^--model_score no_such_module:clip: pair model "
                                                   r"'no_such_module:clip': cannot import no_such_module"),
        (["--model_score", MODEL, "--model_score_arg", "batch"], r"KEY=VALUE, got 'batch'$"),
        (["--model_score", "checkpoint"], r"needs workdir=\.\.\. \(--model_score_arg workdir=DIR\)$"),
        (["--model_score", "checkpoint", "--model_score_arg", f"workdir={tmp_path / 'none'}"],
         r"^--model_score checkpoint: model score checkpoint .*none: no such directory$"),
        (["--model_score", "checkpoint", "--model_score_arg", f"workdir={tmp_path}"],
         r"^--model_score checkpoint: model score checkpoint .*: no config.json, not a trainer.train workdir$"),
    ]
    for extra, message in cases:
        with pytest.raises(launcher.UsageError, match=message):
            launcher.run(base + extra)
    assert not (tmp_path / "out").exists()


# The command line's main in this process in the default run; ``python -m pipeline.build`` (which imports the
# trainer's checkpoint loader: seconds of CPU) in CI's integration run.
@pytest.mark.parametrize("process", ["this", pytest.param("own", marks=pytest.mark.integration)])
def test_an_incompatible_checkpoint_is_one_line_before_any_work(process, tmp_path, capsys):
    """On the command line: the error, one usage line, exit 2, nothing written."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"name": "image_classifier"}}))
    pattern = write_candidates(tmp_path / "in", rows=2)
    argv = ["--input", str(pattern), "--output", str(tmp_path / "out"), *QUICK,
            "--model_score", "checkpoint", "--model_score_arg", f"workdir={run}", "--set", "model_score_top_fraction=0.3"]
    if process == "own":
        done = cli(*argv)
        status, stderr = done.returncode, done.stderr
    else:
        with pytest.raises(SystemExit) as exit_:
            launcher.main(argv)
        status, stderr = exit_.value.code, capsys.readouterr().err
    assert status == launcher.EXIT_USAGE
    assert stderr.splitlines() == [
        f"error: --model_score checkpoint: model score checkpoint {run}: its config is not a two-tower image-text "
        "model (model.name 'image_classifier')", launcher.SHORT_USAGE], stderr
    assert not (tmp_path / "out").exists()
