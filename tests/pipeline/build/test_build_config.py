"""``pipeline.build.config``: the command line resolved once into the one object the launcher and the graph read."""

import ast
import dataclasses
import pathlib

import apache_beam as beam
import pytest

import repo_root
from pipeline.build import graph, options
from pipeline.build.config import BuildConfig, Flags, resolve
from pipeline.build.options import UsageError, parse
from tests.pipeline.build.test_build_safety import write_candidates


def config_of(tmp_path, *extra):
    pattern = write_candidates(tmp_path / "in")
    return resolve(*parse(["--input", str(pattern), "--output", str(tmp_path / "out"), *extra]))


def test_resolution_makes_every_object_once_and_freezes_them(tmp_path):
    config, beam_options = config_of(tmp_path, "--set", "vocab_size=0", "--carry_columns", "lang",
                                     "--read_max_line_bytes", "4096", "--embedder_arg", "size=16")
    assert isinstance(config, BuildConfig) and config.preset.vocab_size == 0
    assert config.columns.carry == ("key", "sha256", "lang") and config.columns.limits.max_line_bytes == 4096
    assert config.embedder_args == (("size", 16),) and config.download is None and config.scorer is None
    assert config.version_dir == f"{config.output}/versions/{config.version}"
    assert len(config.input_files) == 1 and beam_options.view_as(beam.options.pipeline_options.StandardOptions).runner
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.preset = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.flags.overwrite = True
    with pytest.raises(AttributeError, match="declares no flag 'no_such_flag'"):
        config.flags.no_such_flag


def test_flags_survive_pickling():
    import pickle

    flags = pickle.loads(pickle.dumps(Flags({"name": "x", "overwrite": False})))
    assert flags.name == "x" and flags.overwrite is False


@pytest.mark.parametrize("extra, message", [
    (["--eval_images", "imagenet/val=DIR"], r"set name 'imagenet/val' may hold letters"),
    (["--eval_images", "noequals"], r"expected NAME=PATH"),
    (["--concept_labels_column", "labels"], r"needs --concepts"),
    (["--download", "--download_threads", "0"], r"--download_threads 0"),
    (["--set", "no_such=1"], r"no_such"),
    (["--model_score_arg", "workdir=x"], r"--model_score_arg needs --model_score"),
])
def test_a_mistake_is_one_usage_error_before_anything_is_written(tmp_path, extra, message):
    with pytest.raises(UsageError, match=message):
        config_of(tmp_path, *extra)
    assert not (tmp_path / "out").exists()


def test_a_duplicate_evaluation_set_name_is_one_usage_line_before_anything_is_touched(tmp_path, capsys):
    """Two sets of one name would share the reason near_duplicate_eval/NAME: refused as the command line is read."""
    from pipeline.build import launcher

    pattern = write_candidates(tmp_path / "in")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with pytest.raises(SystemExit) as exited:
        launcher.main(["--input", str(pattern), "--output", str(tmp_path / "out"),
                       "--eval_images", f"test={tmp_path / 'a'}", "--eval_images", f"test={tmp_path / 'b'}"])
    assert exited.value.code == launcher.EXIT_USAGE
    error, *usage = capsys.readouterr().err.splitlines()
    assert error == (f"error: --eval_images 'test={tmp_path / 'b'}': the set name 'test' is given twice (each set "
                     "names its own rejection reason near_duplicate_eval/NAME)")
    assert usage == [options.SHORT_USAGE]
    assert not (tmp_path / "out").exists()


def test_the_launcher_makes_the_embedder_once(tmp_path, monkeypatch):
    """The config's embedder checks its arguments, embeds the evaluation sets and gives both searches their cosine."""
    import numpy as np
    from PIL import Image

    from dedup import embedders
    from pipeline.build import launcher

    made, get, build = [], embedders.get, launcher.build_pipeline
    monkeypatch.setattr(embedders, "get", lambda name, **kwargs: made.append(name) or get(name, **kwargs))

    class Built(Exception):
        pass

    def build_and_stop(*args):  # the whole graph, with both near-duplicate searches; nothing runs
        build(*args)
        raise Built

    monkeypatch.setattr(launcher, "build_pipeline", build_and_stop)
    (tmp_path / "eval").mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(
        tmp_path / "eval" / "0.jpg")
    with pytest.raises(Built):
        launcher.run(["--input", str(write_candidates(tmp_path / "in")), "--output", str(tmp_path / "out"),
                      "--eval_images", f"test={tmp_path / 'eval'}", "--set", "dedup_in_corpus=true"])
    assert made == ["dct"]


def test_an_option_declared_in_one_place_reaches_the_graph(tmp_path, monkeypatch):
    """Declaring a flag is all it takes for the graph's composites to read it: no resolver, no launcher change."""
    declare = options.BuildOptions._add_argparse_args.__func__

    def with_dummy(cls, parser):
        declare(cls, parser)
        parser.add_argument("--dummy_option", default="unset")

    monkeypatch.setattr(options.BuildOptions, "_add_argparse_args", classmethod(with_dummy))
    seen = []
    expand = graph.FirstPass.expand
    monkeypatch.setattr(graph.FirstPass, "expand", lambda self, p: seen.append(self.config.flags.dummy_option)
                        or expand(self, p))
    config, _ = config_of(tmp_path, "--dummy_option", "reached")
    graph.build_pipeline(beam.Pipeline(runner="FnApiRunner"), config, {})
    assert seen == ["reached"]


def test_the_graph_and_the_launcher_read_no_option_with_a_default_of_their_own():
    """``getattr(opts, NAME, DEFAULT)`` re-derives an option where it is used; the config resolved it already."""
    found = []
    for path in sorted(pathlib.Path(repo_root.ROOT, "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and len(node.args) == 3
                    and getattr(node.args[0], "id", "") in ("opts", "args", "options", "config", "flags")):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
