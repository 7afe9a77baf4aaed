"""TOnICS in the trainer: refresh arithmetic, class minibatches, hosts agreeing, exact resume."""

import dataclasses
import json
import os
import signal

import jax
import numpy as np
import pytest

from common import schema
from trainer import curriculum, train
from trainer.concept_batches import ClassBatches, ConceptIndex
from trainer.configs import tiny


def _trainer_fixtures():
    """tests/trainer/conftest.py as a module (two conftest.py files: no plain import names it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_trainer_conftest", os.path.join(os.path.dirname(__file__),
                                                                                   "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_fixtures = _trainer_fixtures()
CORPUS_NAME, SHAPES, TINY_MAX_LEN, TINY_VOCAB_SIZE = (
    _fixtures.CORPUS_NAME, _fixtures.SHAPES, _fixtures.TINY_MAX_LEN, _fixtures.TINY_VOCAB_SIZE)
make_scene_record = _fixtures.make_scene_record

ALPHA, BETA = 0.9, 0.2


# ---------------------------------------------------------------------------
# Refresh arithmetic and the per-step choice
# ---------------------------------------------------------------------------


def test_refresh_conserves_mass_splits_by_size_and_stops_at_beta():
    sizes = [50, 30, 20, 0]
    probs = [1.0, 0.0, 0.0, 0.0, 0.0]
    roots = [1.0]
    for _ in range(40):
        new = curriculum.refreshed_probs(probs, sizes, ALPHA, BETA)
        assert sum(new) == pytest.approx(1.0, abs=1e-12)            # mass conserved
        assert new[0] >= BETA - 1e-15                                 # floor respected
        gained = np.subtract(new[1:], probs[1:])
        freed = probs[0] - new[0]
        # Proportional to |X(o)|; a class without pairs gets nothing.
        np.testing.assert_allclose(gained, freed * np.array(sizes) / sum(sizes), rtol=1e-12, atol=1e-15)
        probs = new
        roots.append(probs[0])
    # The paper's multiplicative steps while above the floor ...
    assert roots[1] == pytest.approx(0.9) and roots[2] == pytest.approx(0.81)
    # ... the last one lands exactly on beta, after which nothing moves.
    assert roots[-1] == BETA and roots.count(BETA) > 1
    assert probs[4] == 0.0
    assert probs[1] / probs[2] == pytest.approx(50 / 30)


def test_maybe_refresh_needs_the_threshold_and_records_history():
    state = curriculum.CurriculumState.start(["a", "b"], [3, 1])
    assert not curriculum.maybe_refresh(state, 5, 0.89, threshold=0.9, alpha=ALPHA, beta=BETA)
    assert state.probs == [1.0, 0.0, 0.0] and state.refreshes == []
    assert curriculum.maybe_refresh(state, 10, 0.9, threshold=0.9, alpha=ALPHA, beta=BETA)  # >= refreshes
    assert state.probs == pytest.approx([0.9, 0.075, 0.025])
    assert state.refreshes == [{"step": 10, "accuracy": 0.9, "p_root": pytest.approx(0.9)}]
    with pytest.raises(ValueError):
        curriculum.refreshed_probs(state.probs, state.sizes, alpha=1.0, beta=BETA)


def test_choice_is_a_function_of_seed_step_and_probs():
    probs = [0.5, 0.3, 0.2]
    draws = [curriculum.choose_node(probs, seed=3, step=s) for s in range(1, 4001)]
    assert draws == [curriculum.choose_node(list(probs), seed=3, step=s) for s in range(1, 4001)]
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, probs, atol=0.03)
    assert draws != [curriculum.choose_node(probs, seed=4, step=s) for s in range(1, 4001)]
    assert {curriculum.choose_node([1.0, 0.0, 0.0], 0, s) for s in range(200)} == {0}


def test_state_round_trips_through_json_exactly():
    state = curriculum.CurriculumState.start(["a", "b"], [7, 2])
    for step in (5, 10, 15):
        curriculum.maybe_refresh(state, step, 0.95, threshold=0.9, alpha=ALPHA, beta=BETA)
    state.choices = {"root": 12, "a": 3}
    again = curriculum.CurriculumState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state and again.probs == state.probs  # bit-exact floats


# ---------------------------------------------------------------------------
# Class minibatches from a tagged corpus
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tagged_corpus(tmp_path_factory):
    """The tiny corpus as a ``--concepts`` build writes it: concepts feature, per-shard index, stats."""
    from common.ontology import from_dict
    from filters.concepts import Tagger
    from pipeline.write import concept_tags as concepts_lib
    from common import tfrecord_io as tfrecord
    from pipeline.write.shards import concept_offsets
    from pipeline.publish.tfds_metadata import write_metadata as write_tfds_metadata
    from trainer.vocab import build_vocab

    ontology = from_dict({"classes": {s: [s, s + "s"] for s in SHAPES}})
    tagger = Tagger(ontology)
    data_dir = tmp_path_factory.mktemp("tagged")
    rng = np.random.default_rng(0)
    lengths, counts = {}, {}
    for split, size, num_shards in (("train", 60, 3), ("validation", 16, 1)):
        records = [make_scene_record(rng, split, i) for i in range(size)]
        for record in records:
            record["concepts"] = " ".join(tagger.tag(record["texts"]))
            for name in record["concepts"].split():
                counts[(split, name)] = counts.get((split, name), 0) + 1
        per_shard = size // num_shards
        lengths[split] = [per_shard] * num_shards
        os.makedirs(data_dir / "concepts", exist_ok=True)
        for shard in range(num_shards):
            chunk = records[shard * per_shard:(shard + 1) * per_shard]
            payloads = [tfrecord.encode_example(r) for r in chunk]
            name = schema.shard_filename(CORPUS_NAME, split, shard, num_shards)
            with open(data_dir / name, "wb") as handle:
                tfrecord.write_records(handle, payloads)
            offsets = concept_offsets(payloads, [tuple(r["concepts"].split()) for r in chunk])
            (data_dir / "concepts" / f"{name}.json").write_text(
                json.dumps({"shard": name, "records": len(chunk), "offsets": offsets}))
    write_tfds_metadata(str(data_dir), CORPUS_NAME, lengths, description="tagged", concepts=True)
    os.makedirs(data_dir / "stats", exist_ok=True)
    (data_dir / "stats" / "concepts.json").write_text(json.dumps(concepts_lib.concept_stats(counts, ontology)))
    build_vocab(str(data_dir), TINY_VOCAB_SIZE)
    open(data_dir / "COMPLETED", "w").close()
    return str(data_dir)


@pytest.fixture(scope="module")
def tokenizer(tagged_corpus):
    from trainer.tokenizer import Tokenizer

    return Tokenizer(os.path.join(tagged_corpus, "vocab.txt"), max_len=TINY_MAX_LEN)


def class_batches(corpus, tokenizer, batch, host=0, hosts=1, say=print):
    return ClassBatches(ConceptIndex(corpus), global_batch_size=batch, process_index=host, process_count=hosts,
                        image_size=32, resize_size=36, flip_lr=False, seed=7, tokenizer=tokenizer, say=say)


def test_index_lists_every_tagged_train_pair(tagged_corpus):
    index = ConceptIndex(tagged_corpus)
    assert index.classes == list(SHAPES) and index.sizes() == [20, 20, 20]
    assert len(index.files) == 3


def test_object_node_minibatch_holds_only_that_class(tagged_corpus, tokenizer):
    batches = class_batches(tagged_corpus, tokenizer, batch=8)
    for step, name in enumerate(SHAPES * 2, start=1):
        batch = batches.batch(name, step)
        assert batch["image"].shape == (8, 32, 32, 3) and batch["text"].shape == (8, TINY_MAX_LEN)
        assert all(name in c.decode().split() for c in batch["concepts"])
        texts = [ex for ex in batches.serialized(name, step)]
        assert all(name.encode() in t for t in texts)   # the caption itself names it
        # Without replacement when the class holds a whole batch.
        assert len(set(map(tuple, batches.draw(name, step)))) == 8
    batches.close()


def test_small_class_drawn_with_replacement_and_said(tagged_corpus, tokenizer):
    said = []
    batches = class_batches(tagged_corpus, tokenizer, batch=32, say=said.append)
    rows = batches.draw("circle", 1)
    assert len(rows) == 32 and len(set(map(tuple, rows))) <= 20
    batches.draw("circle", 2)
    assert len(said) == 1 and "with replacement" in said[0] and "circle" in said[0]


def test_two_hosts_draw_disjoint_halves_of_one_global_batch(tagged_corpus, tokenizer):
    single = class_batches(tagged_corpus, tokenizer, batch=16)
    hosts = [class_batches(tagged_corpus, tokenizer, batch=16, host=h, hosts=2) for h in (0, 1)]
    state = [curriculum.CurriculumState.start(list(SHAPES), [20, 20, 20]) for _ in hosts]
    for s in state:
        for step in (5, 10, 15, 20):
            curriculum.maybe_refresh(s, step, 0.95, threshold=0.9, alpha=0.5, beta=0.1)
    for step in range(1, 30):
        nodes = [curriculum.choose_node(s.probs, 7, step) for s in state]
        assert nodes[0] == nodes[1]                                 # same node on both hosts
        if nodes[0] == curriculum.ROOT:
            continue
        name = SHAPES[nodes[0] - 1]
        halves = [h.draw(name, step) for h in hosts]
        np.testing.assert_array_equal(np.concatenate(halves), single.draw(name, step))
        assert not set(map(tuple, halves[0])) & set(map(tuple, halves[1]))


def test_corpus_without_index_is_refused_clearly(tiny_corpus):
    with pytest.raises(FileNotFoundError, match="--concepts"):
        ConceptIndex(tiny_corpus)


@pytest.mark.parametrize("name,text,what", [
    ("concepts/*.json", '{"offsets": {"circle": [12, -3]}}', "offsets.circle: not a list of byte offsets"),
    ("concepts/*.json", "[" * 100_000, "nested 100,000 deep"),
    ("stats/concepts.json", '{"classes": [1, 2]}', "classes[0]: 1, not a string"),
])
def test_a_damaged_class_index_is_one_line_naming_it(tagged_corpus, tmp_path, name, text, what):
    import glob
    import shutil

    from common.state_files import DamagedFile

    corpus = tmp_path / "corpus"
    shutil.copytree(tagged_corpus, corpus)
    path = sorted(glob.glob(str(corpus / name)))[0]
    with open(path, "w") as handle:
        handle.write(text)
    with pytest.raises(DamagedFile) as error:
        ConceptIndex(str(corpus))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and what in message, message


# ---------------------------------------------------------------------------
# The train loop: refresh, metrics, exact resume
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Size:
    """A curriculum run: ``total`` steps, SIGTERM after ``stop``, P_S(root) halved down to ``beta``."""

    total: int
    stop: int
    beta: float
    p_root: tuple          # after each step's refresh
    refreshed: tuple
    image_size: int
    resize_size: int
    filters: tuple         # the CNN image tower's channels


# Light (the default run): the smallest input that still reaches the floor, stops refreshing and draws a
# class minibatch after the resume (seed 0 draws root, root, class). Heavy (integration): 32 px, 5 steps.
LIGHT = Size(total=3, stop=1, beta=0.3, p_root=(0.5, 0.3, 0.3), refreshed=(1, 1, 0), image_size=16,
             resize_size=18, filters=(8, 16))
HEAVY = Size(total=5, stop=2, beta=0.1, p_root=(0.5, 0.25, 0.125, 0.1, 0.1), refreshed=(1, 1, 1, 1, 0),
             image_size=32, resize_size=tiny.get_config().resize_size, filters=tiny.get_config().model.image.filters)


@pytest.fixture(scope="module", params=[pytest.param(LIGHT, id="light"),
                                        pytest.param(HEAVY, id="heavy", marks=pytest.mark.integration)])
def size(request):
    return request.param


def tonics_config(corpus, cache_dir, size):
    config = tiny.get_config()
    config.update({"data_dir": corpus, "total_steps": size.total, "batch_size": 8, "image_size": size.image_size,
                   "resize_size": size.resize_size,
                   "max_text_len": TINY_MAX_LEN, "log_every": 1, "checkpoint_every": 100, "eval_batch_size": 8,
                   "compilation_cache_dir": cache_dir, "xla_cpu_fast_compile": True, "evals": {}})
    config.model.image.filters = size.filters
    # Refresh every step on 8 held-out pairs; threshold 0 refreshes every time.
    config.tonics.update({"enabled": True, "refresh_every": 1, "refresh_instances": 8,
                          "refresh_threshold": 0.0, "alpha": 0.5, "beta": size.beta})
    return config


def read_rows(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def saved_curriculum(workdir, step):
    with open(os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")) as handle:
        return json.load(handle)["tonics"]


@pytest.fixture(scope="module")
def cache_dir(jax_cache_dir):
    return jax_cache_dir


@pytest.fixture(scope="module")
def uninterrupted(size, tagged_corpus, cache_dir, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("tonics_run"))
    final = train.train_and_evaluate(tonics_config(tagged_corpus, cache_dir, size), workdir)
    return workdir, final


def test_run_refreshes_and_logs_the_curriculum(uninterrupted, size):
    workdir, final = uninterrupted
    assert final["step"] == size.total
    rows = read_rows(workdir)
    refreshes = [r for r in rows if "tonics/refresh_accuracy" in r]
    assert [r["step"] for r in refreshes] == list(range(1, size.total + 1))
    # alpha 0.5 down to the floor beta (heavy: 0.5, 0.25, 0.125, then 0.1), then no more refreshes.
    assert [r["tonics/p_root"] for r in refreshes] == pytest.approx(list(size.p_root))
    assert [r["tonics/refreshed"] for r in refreshes] == list(size.refreshed)
    choices = [r for r in rows if "train/loss" in r]
    per_step = [{k[len("tonics/steps/"):] for k in r if k.startswith("tonics/steps/")} for r in choices]
    assert all(len(s) == 1 for s in per_step)                     # log_every 1: one node per step
    assert per_step[0] == {"root"}                                 # P_S(root) = 1 before any refresh
    assert any(s != {"root"} for s in per_step[1:])                # class minibatches once mass moved


def test_preempted_run_resumes_the_curriculum_exactly(uninterrupted, size, tagged_corpus, cache_dir, tmp_path):
    reference, _ = uninterrupted
    workdir = str(tmp_path / "preempted")
    config = tonics_config(tagged_corpus, cache_dir, size)

    def preempt(step):
        if step == size.stop:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train.train_and_evaluate(config, workdir, after_step=preempt)
    assert first["preempted"] and first["step"] == size.stop
    state = saved_curriculum(workdir, size.stop)
    assert len(state["refreshes"]) == size.stop        # the SIGTERM step refreshes before its save
    train.train_and_evaluate(config, workdir)
    assert saved_curriculum(workdir, size.total) == saved_curriculum(reference, size.total)
    want = {r["step"]: r for r in read_rows(reference) if "train/loss" in r}
    got = {r["step"]: r for r in read_rows(workdir) if "train/loss" in r}
    # The resumed steps draw a class minibatch too (not only the stream's root batches).
    assert any(k.startswith("tonics/steps/") and k != "tonics/steps/root"
               for step in range(size.stop + 1, size.total + 1) for k in got[step])
    for step in range(1, size.total + 1):
        assert {k for k in got[step] if k.startswith("tonics/steps/")} == {
            k for k in want[step] if k.startswith("tonics/steps/")}, step
        assert got[step]["train/loss"] == pytest.approx(want[step]["train/loss"], rel=1e-6), step


@pytest.mark.slow  # compiles another train step (a different loss and a frozen tower)
def test_image_retrieval_loss_and_frozen_text_tower(uninterrupted, size, tagged_corpus, cache_dir, tmp_path):
    from trainer import checkpoint

    source, _ = uninterrupted
    config = tonics_config(tagged_corpus, cache_dir, size)
    config.update({"total_steps": 2, "init_from": source, "freeze": "text"})
    config.optim.warmup_steps = 1   # step 0's learning rate is 0 in a warmup; step 1's is the peak
    config.loss.directions = "image_retrieval"
    config.tonics.enabled = False
    workdir = str(tmp_path / "aligned")
    final = train.train_and_evaluate(config, workdir)
    assert final["train/loss"] == pytest.approx(final["train/loss_t2i"])    # L_IR only
    before, after = checkpoint.load_model(source)[1], checkpoint.load_model(workdir)[1]
    for a, b in zip(jax.tree.leaves(before["params"]["text_tower"]), jax.tree.leaves(after["params"]["text_tower"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    moved = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree.leaves(before["params"]["image_tower"]), jax.tree.leaves(after["params"]["image_tower"]))]
    assert any(moved)
