"""The evaluators of a training run: ``config.evals`` over the encoders of the current train state.

``trainer.train`` builds one ``Evaluation`` before its loop and runs it at
the steps it is due (and at the end) on that step's state. The encoders run
on the run's mesh: every host passes the same full batch, and every host
gets the whole batch's embeddings back (replicated output; the gather across
processes happens inside the program), so the numpy evaluators compute the
same numbers on every host.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from trainer import evaluators as evaluators_lib


class Evaluation:
    """``config.evals`` (``trainer.evaluators.build``) over the encoders of a state's params."""

    def __init__(self, config, workdir: str, model, mesh, tokenizer, compiler_options: dict, *,
                 say: Callable[[str], None]):
        self.mesh, self.say = mesh, say
        replicated = NamedSharding(mesh, P())

        def apply_for(tower: str):
            @functools.partial(jax.jit, out_shardings=replicated, compiler_options=compiler_options)
            def apply(variables, x):
                zimg, ztxt, _ = model.apply(variables, **{tower: x}, train=False)
                return zimg if tower == "images" else ztxt

            return apply

        # Made once: a jitted function's compiled programs live as long as it does.
        self.apply = {tower: apply_for(tower) for tower in ("images", "texts")}
        self.evaluators = evaluators_lib.build(
            config.evals or {}, data_dir=config.data_dir, eval_dir=config.eval_dir,
            context={"data_dir": config.data_dir, "workdir": workdir, "image_size": config.image_size,
                     "resize_size": config.resize_size, "tokenizer": tokenizer,
                     "batch_size": config.eval_batch_size})

    def due(self, step: int) -> bool:
        """Whether an evaluator runs every so many steps and ``step`` is one of them."""
        return any(every and step % every == 0 for _, every, _ in self.evaluators)

    def encoders(self, state: dict) -> tuple:
        """(encode_images, encode_texts) of ``state``'s params: numpy rows in, numpy embeddings out."""
        variables = {"params": state["params"], "batch_stats": state["batch_stats"]}
        batch_sharded = NamedSharding(self.mesh, P("data"))

        def encoder(tower: str):
            def encode(x: np.ndarray) -> np.ndarray:
                # Every host passes the same full batch; pad it to the mesh.
                x = np.asarray(x)
                rows = len(x)
                pad = -rows % jax.device_count()
                if pad:
                    x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
                x = jax.make_array_from_callback(x.shape, batch_sharded, lambda index: x[index])
                return np.asarray(self.apply[tower](variables, x).addressable_data(0))[:rows]

            return encode

        return encoder("images"), encoder("texts")

    def run(self, step: int, state: dict, final: bool) -> dict:
        """The evaluators due at ``step`` (every one if ``final``) on ``state``: {"<name>/<metric>": value}."""
        encode_images, encode_texts = self.encoders(state)
        results = {}
        for name, every, evaluator in self.evaluators:
            if final or (every and step % every == 0):
                start = time.time()
                for key, value in evaluator.run(encode_images, encode_texts).items():
                    results[f"{name}/{key}"] = float(value)
                self.say(f"step {step} eval {name} ({time.time() - start:.0f}s): " + ", ".join(
                    f"{k[len(name) + 1:]} {v:.4g}" for k, v in results.items()
                    if k.startswith(name + "/") and not k.endswith("_chance")))
        return results
