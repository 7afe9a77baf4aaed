"""``pipeline.build.graph``: the stages a build applies are the stages its configuration asks for."""

import apache_beam as beam


def test_stages_run_come_from_the_stages_applied(tmp_path):
    from filters.frequency import stages_run as corpus_stages_run
    from pipeline.build.config import resolve
    from pipeline.build.graph import build_pipeline
    from pipeline.build.options import parse
    from pipeline.stages.judge import RECORD_STAGES
    from tests.pipeline.build.test_build_safety import write_candidates

    pattern = str(write_candidates(tmp_path / "in"))

    def graph(*overrides):
        config, _ = resolve(*parse(["--input", pattern, "--output", str(tmp_path / "out"), *overrides]))
        return config, build_pipeline(beam.Pipeline(runner="FnApiRunner"), config, {"nsfw": "a note"})

    align, ran = graph()
    assert ran.names == ["read", *RECORD_STAGES, "nsfw", *corpus_stages_run(align.preset), "duplicate_pair"]
    assert ran.notes == {"nsfw": "a note"}
    _, off = graph("--set", "nsfw_threshold=1.0", "--set", "dedup_in_corpus=true")
    assert "nsfw" not in off.names and off.names[-2:] == ["near_duplicate_corpus", "duplicate_pair"]
    _, cc12m = graph("--preset", "cc12m")
    assert "texts_per_image" not in cc12m.names and "rare_ngrams" in cc12m.names  # cc12m has no sharing limits
    assert off.notes["near_duplicate_corpus"].startswith("same sha256, same pHash, or embedding cosine > ")
