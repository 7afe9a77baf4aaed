"""TOnICS in the train loop: a batch policy (``trainer.batch_policy``) over the curriculum.

Each step's batch is that of the node ``choose(step)`` draws: the root is the
ordinary random minibatch (the ``RandomBatches`` stream it wraps), a class
name is ``class_batch(name, step)`` (``trainer.concept_batches``). Every
``refresh_every`` steps ``update`` evaluates held-out image retrieval (text
-> image R@1, the paper's accuracy, over the first ``refresh_instances`` pairs
of ``refresh_split``) and refreshes P_S (``trainer.curriculum``). ``meta`` /
``restore`` carry P_S, the refresh history and the choice counts through
checkpoints, with the stream's position. Config (``config.tonics``; paper
defaults):

    enabled            False
    refresh_every      5000 steps
    refresh_instances  100 held-out pairs
    refresh_threshold  0.9 (accuracy at or above it refreshes)
    alpha              0.9 (P_S(root) kept per refresh)
    beta               0.2 (P_S(root) floor)
    refresh_split      "validation"
"""

from __future__ import annotations

from typing import Callable, Dict

from trainer import curriculum as curriculum_lib, input_pipeline
from trainer.concept_batches import ClassBatches, ConceptIndex


class Tonics:
    """The TOnICS batch policy; root steps read ``random``'s stream (a ``trainer.batch_policy.RandomBatches``)."""

    def __init__(self, config, tokenizer, mesh, random, *, process_index: int,
                 process_count: int, say: Callable[[str], None]):
        from trainer.evaluators.retrieval import RetrievalEvaluator

        self.random, self.mesh = random, mesh
        self.cfg = config.tonics
        self.seed = int(config.seed)
        self.say = say
        index = ConceptIndex(config.data_dir, config.train_split)
        self.state = curriculum_lib.CurriculumState.start(index.classes, index.sizes())
        empty = [name for name, size in zip(index.classes, index.sizes()) if size == 0]
        say(f"TOnICS: {len(index.classes)} object classes, {sum(index.sizes()):,} (pair, class) instances"
            + (f"; no pair for {', '.join(empty)} (never drawn)" if empty else ""))
        self.batches = ClassBatches(
            index, global_batch_size=config.batch_size, process_index=process_index,
            process_count=process_count, image_size=config.image_size, resize_size=config.resize_size,
            flip_lr=config.flip_lr, colour_augment=config.colour_augment, seed=self.seed, tokenizer=tokenizer, say=say)
        self.evaluator = RetrievalEvaluator(
            config.data_dir, image_size=config.image_size, resize_size=config.resize_size,
            tokenizer=tokenizer, batch_size=config.eval_batch_size, split=self.cfg.refresh_split,
            max_pairs=self.cfg.refresh_instances, ks=(1,))
        self.since_log: Dict[str, int] = {}

    def batch(self, step: int) -> dict:
        node = self.choose(step)
        if node == "root":
            return self.random.batch(step)
        return input_pipeline.to_global_array(self.class_batch(node, step), self.mesh)

    def update(self, step: int, encoders) -> dict:
        return self.refresh(step, *encoders) if self.due(step) else {}

    def meta(self) -> dict:
        return {**self.random.meta(), "tonics": self.state.to_json()}

    def restore(self, meta: dict) -> None:
        self.random.restore(meta)
        if "tonics" not in meta:   # a checkpoint of a run without the curriculum: P_S starts afresh
            return
        state = curriculum_lib.CurriculumState.from_json(meta["tonics"])
        if state.classes != self.state.classes or state.sizes != self.state.sizes:
            raise ValueError("the checkpoint's TOnICS classes or |X(o)| differ from this corpus's class index")
        self.state = state

    def choose(self, step: int) -> str:
        """The node of ``step`` ("root" or a class name), counted."""
        name = self.state.node_name(curriculum_lib.choose_node(self.state.probs, self.seed, step))
        self.state.choices[name] = self.state.choices.get(name, 0) + 1
        self.since_log[name] = self.since_log.get(name, 0) + 1
        return name

    def class_batch(self, name: str, step: int) -> dict:
        batch = self.batches.batch(name, step)
        return {"image": batch["image"], "text": batch["text"]}

    def due(self, step: int) -> bool:
        return bool(self.cfg.refresh_every) and step % self.cfg.refresh_every == 0

    def refresh(self, step: int, encode_images, encode_texts) -> dict:
        """Held-out accuracy and, if it reaches the threshold, a refresh; returns the metrics to write."""
        accuracy = self.evaluator.run(encode_images, encode_texts)["t2i_R@1"]
        done = curriculum_lib.maybe_refresh(self.state, step, accuracy, threshold=self.cfg.refresh_threshold,
                                           alpha=self.cfg.alpha, beta=self.cfg.beta)
        self.say(f"step {step} TOnICS: held-out image retrieval R@1 {accuracy:.3f} "
                 f"({'refresh' if done else 'no refresh'}, threshold {self.cfg.refresh_threshold}); "
                 f"P_S(root) {self.state.p_root:.4f} after {len(self.state.refreshes)} refresh(es)")
        return {"tonics/refresh_accuracy": accuracy, "tonics/refreshed": float(done), **self.gauges()}

    def gauges(self) -> dict:
        return {"tonics/p_root": self.state.p_root, "tonics/refreshes": float(len(self.state.refreshes))}

    def log_metrics(self) -> dict:
        """P_S(root), refreshes, and how many steps drew each node since the previous log point."""
        counts = {f"tonics/steps/{name}": float(n) for name, n in sorted(self.since_log.items())}
        self.since_log = {}
        return {**self.gauges(), **counts}

    def close(self):
        self.random.close()
        self.batches.close()
