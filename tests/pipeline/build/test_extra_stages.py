"""Extra stages: the manual's example (docs/extending.md) runs as written, and counts like a built-in stage."""

import collections
import glob
import json
import os
import re
import shlex
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import repo_root
from corpus_paths import committed
from filters import extra_stages, language
from filters.presets import get_preset
from filters.record import Candidate, judge_record
from pipeline.audit import auditor as audit
from pipeline.build import launcher
from pipeline.build.options import UsageError
from tests import images as made
from tests.pipeline.build.test_build_safety import write_candidates

ROOT = repo_root.ROOT


def manual_example():
    """The ``# my_rules.py`` block of docs/extending.md and its build command."""
    text = open(os.path.join(ROOT, "docs", "extending.md")).read()
    module = re.search(r"```python\n(# my_rules\.py\n.*?)```", text, re.S).group(1)
    command = re.search(r"```bash\n(PYTHONPATH=\. python -m pipeline\.build .*?--stage my_rules:NUMBERED.*?)```",
                        text, re.S).group(1)
    return module, shlex.split(command.replace("\\\n", " "))


def jpeg(index, size=(480, 420)):
    return made.tinted(index, size, ((index % size[0], 0), (255 - (37 * index) % 256, 0, 0)))


# English captions from a small vocabulary (every word seen >= 20 times, so
# cc12m's rare-word rule keeps them), a few German ones, and links.
ENGLISH = ["a red car on the road", "the old house near the river", "a small dog on the grass",
           "a blue boat on the river", "the red house near the road"]
CAPTIONS = (
    [(ENGLISH[i % 5], "written") for i in range(100)]
    + [("ein rotes Auto auf der Straße", "language/de")] * 3
    + [("une petite maison près de la rivière", "language/fr")] * 2
    + [("a red car on the road https://shop.example/car", "no_links/has_link")] * 2
    + [("red car", "text_length/too_few_words")]  # a built-in stage before both extras wins
    # One numbered template on 12 images (> 10): the corpus extra, placed
    # before rare_ngrams, wins over the rare-word rule the numbers also fail.
    + [(f"a red car on the road {i}", "caption_template/shared_template") for i in range(12)]
    # A template on 5 images passes it; its number (5 occurrences < 20) is a rare word.
    + [("a small dog on the grass 77", "rare_ngrams/rare_ngram")] * 5
)


@pytest.fixture(scope="module")
def example_build(tmp_path_factory):
    module, argv = manual_example()
    root = tmp_path_factory.mktemp("extra")
    (root / "rules").mkdir()
    (root / "rules" / "my_rules.py").write_text(module)
    (root / "in").mkdir()
    rows = [{"url": f"https://img.example.com/{i}.jpg", "caption": c, "jpg": jpeg(i)} for i, (c, _) in enumerate(CAPTIONS)]
    pq.write_table(pa.table({
        "url": [r["url"] for r in rows], "caption": [r["caption"] for r in rows],
        "jpg": pa.array([r["jpg"] for r in rows], pa.binary())}), str(root / "in" / "part-0.parquet"))
    # The manual's command as written, with this test's input and output.
    assert argv[:4] == ["PYTHONPATH=.", "python", "-m", "pipeline.build"]
    args = argv[4:]
    args[args.index("--input") + 1] = str(root / "in" / "*.parquet")
    args[args.index("--output") + 1] = str(root / "out")
    sys.path.insert(0, str(root / "rules"))  # what PYTHONPATH=. does for the manual's layout
    try:
        funnel = launcher.run(args)
    finally:
        sys.path.remove(str(root / "rules"))
        sys.modules.pop("my_rules", None)
    return rows, committed(root / "out"), funnel


def test_the_manual_example_runs_and_its_stages_reject_like_built_in_ones(example_build):
    rows, out, funnel = example_build
    fates = {}
    for path in glob.glob(str(out / "*.tfrecord*")):
        for raw in tf.data.TFRecordDataset(path):
            fates[tf.train.Example.FromString(raw.numpy()).features.feature["url"].bytes_list.value[0].decode()] = "written"
    for path in glob.glob(str(out / "stats" / "rejected" / "*.jsonl")):
        for line in open(path):
            row = json.loads(line)
            fates[row["url"]] = row["reason"]
    assert fates == {r["url"]: fate for r, (_, fate) in zip(rows, CAPTIONS)}

    names = [row["stage"] for row in funnel["stages"]]
    assert names.index("no_links") == names.index("text_repetition") + 1
    assert names.index("language") == names.index("no_links") + 1
    by_name = {row["stage"]: row for row in funnel["stages"]}
    assert by_name["no_links"]["rejected"] == {"no_links/has_link": 2}
    assert by_name["language"]["rejected"] == {"language/de": 3, "language/fr": 2}
    assert by_name["language"]["extra"] == "filters.language:ENGLISH" and by_name["language"]["ran"]
    assert names.index("caption_template") == names.index("images_per_text") + 1
    assert by_name["caption_template"]["rejected"] == {"caption_template/shared_template": 12}
    assert by_name["caption_template"]["extra"] == "my_rules:NUMBERED"
    distributions = json.loads((out / "stats" / "distributions.json").read_text())
    assert "caption_template" in distributions
    assert funnel["conserved"]
    metrics = json.loads((out / "stats" / "metrics.json").read_text())
    assert metrics["no_links/has_link"] == 2 and metrics["language/de"] == 3
    assert metrics["caption_template/shared_template"] == 12
    assert audit.check_funnel(funnel) == []
    printed = audit.format_funnel(funnel)
    assert re.search(r"no_links .* has_link 2", printed) and re.search(r"language .* de 3, fr 2", printed)


def test_rejected_samples_of_extra_stages_are_in_the_audit_sample(example_build):
    _, out, _ = example_build
    samples = [json.loads(line) for line in open(out / "stats" / "rejected_samples.jsonl")]
    stages_seen = [s["stage"] for s in samples]
    assert "no_links" in stages_seen and "language" in stages_seen
    assert stages_seen.index("no_links") < stages_seen.index("language")


def _views(caption):
    return Candidate("k", "https://x/1.jpg", caption, jpeg(1))


def test_first_reason_wins_in_the_declared_order():
    def always(detail):
        return lambda record: detail

    early = extra_stages.RecordStage("early", after="image_aspect", check=always("no"), reasons=("no",))
    late = extra_stages.RecordStage("late", after="image_decode", check=always("no"), reasons=("no",))
    preset = get_preset("align")
    assert judge_record(_views("a red car on the road"), preset, (late,)).reason == "late/no"
    assert judge_record(_views("a red car on the road"), preset, (late, early)).reason == "early/no"
    # a built-in stage before the extra wins; one after it never runs
    assert judge_record(_views("red car"), preset, (late,)).reason == "text_length/too_few_words"
    assert judge_record(_views("red car"), preset, (early,)).reason == "early/no"
    listed = [n for n, _ in extra_stages.stage_list((late, early))]
    assert listed[listed.index("image_aspect"):][:3] == ["image_aspect", "early", "text"]


def test_bad_stage_definitions_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="after must be one of"):
        extra_stages.RecordStage("x", after="rare_ngrams", check=len, reasons=("a",))
    with pytest.raises(ValueError, match="built-in"):
        extra_stages.RecordStage("text", after="image_decode", check=len, reasons=("a",))
    with pytest.raises(ValueError, match="expected MODULE:ATTRIBUTE"):
        extra_stages.load("filters.language")
    with pytest.raises(ValueError, match="not a filters.extra_stages.RecordStage"):
        extra_stages.load("filters.language:language_stage")
    with pytest.raises(UsageError, match="cannot import no_such_module"):
        launcher.run(["--input", str(write_candidates(tmp_path / "in")), "--output", str(tmp_path / "out"),
                      "--stage", "no_such_module:X"])
    stage = extra_stages.RecordStage("odd", after="image_decode", check=lambda r: "surprise", reasons=("no",))
    with pytest.raises(ValueError, match="not one of its reasons"):
        judge_record(_views("a red car on the road"), get_preset("align"), (stage,))


def test_language_stage_reasons_per_language_and_threshold():
    pytest.importorskip("langid")
    view = lambda text: extra_stages.RecordView("k", "u", text, "JPEG", 480, 420, b"")  # noqa: E731
    english = language.ENGLISH
    assert english.run(view("a red sports car on the road")) is None
    assert english.run(view("ein rotes Auto auf der Straße")) == "language/de"
    assert english.run(view("IMG 2031")) == "language/uncertain"
    german = language.language_stage(("de",), 0.9)
    assert german.run(view("ein rotes Auto auf der Straße")) is None
    assert german.run(view("a red sports car on the road")) == "language/en"
    with pytest.raises(ValueError, match="langid does not know: klingon"):
        language.language_stage(("klingon",))
    counts = collections.Counter(english.run(view(t)) for t in ENGLISH)
    assert counts == {None: len(ENGLISH)}
