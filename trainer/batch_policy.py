"""Which batch each train step gets: a batch policy.

The train loop asks its policy for every step's batch and otherwise only
carries the policy's state through checkpoints and its metrics to the log.
``RandomBatches`` (the default) is the input pipeline's shuffled stream of
the train split; ``trainer.tonics.Tonics`` (``config.tonics.enabled``) draws
a curriculum node per step and takes root steps from a ``RandomBatches``.
A policy has:

    batch(step)            the step's global batch (arrays laid out on the mesh)
    log_metrics()          what it adds to each log point's train metrics
    update(step, encoders) after the step's dispatch, before its checkpoint:
                           metrics to write ({}: none); ``encoders`` are the
                           (images, texts) encoders of the step's state
    meta()                 JSON saved in each checkpoint's meta
    restore(meta)          from a checkpoint's meta (the data position and more)
    close()                stops its background work

Everything a policy draws is a function of the seed, the step and its saved
state, the same on every host: a resumed run gets exactly the batches of an
uninterrupted one.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import jax

from trainer import input_pipeline
from trainer.shard_reader import ShardReader, damage_in


class RandomBatches:
    """The default policy: the train split's shuffled stream, resumed at the batch it reached."""

    def __init__(self, config, tokenizer, mesh, reader: ShardReader):
        self.config, self.tokenizer, self.mesh, self.reader = config, tokenizer, mesh, reader
        self.consumed = 0           # batches of the stream taken so far (the checkpoint's data position)
        self._data: Optional[Iterator[dict]] = None

    def _stream(self, start_batch: int) -> Iterator[dict]:
        import tensorflow as tf

        c = self.config
        dataset = input_pipeline.make_dataset(
            c.data_dir, c.train_split, global_batch_size=c.batch_size, image_size=c.image_size,
            resize_size=c.resize_size, train=True, flip_lr=c.flip_lr, colour_augment=c.colour_augment,
            seed=c.seed, tokenizer=self.tokenizer, start_batch=start_batch, reader=self.reader)
        try:
            for batch in dataset.as_numpy_iterator():
                yield input_pipeline.to_global_array({"image": batch["image"], "text": batch["text"]}, self.mesh)
        except tf.errors.OpError as error:  # raised inside tf.data: the reader's own one-line error
            raise damage_in(error) or error

    def batch(self, step: int) -> dict:
        del step  # the stream's next batch, whatever the step
        if self._data is None:
            self._data = self._stream(self.consumed)
        batch = next(self._data)
        self.consumed += 1
        return batch

    def log_metrics(self) -> dict:
        return {}

    def update(self, step: int, encoders) -> dict:
        return {}

    def meta(self) -> dict:
        return {"batches_consumed": self.consumed}

    def restore(self, meta: dict) -> None:
        self.consumed = meta["batches_consumed"]

    def close(self) -> None:
        if self._data is not None:
            self._data.close()  # stops tf.data's background threads now, not at garbage collection


def make(config, tokenizer, mesh, reader: ShardReader, say: Callable[[str], None]):
    """The run's policy: TOnICS with ``config.tonics.enabled``, else random batches."""
    random = RandomBatches(config, tokenizer, mesh, reader)
    if not config.tonics.enabled:
        return random
    from trainer.tonics import Tonics

    return Tonics(config, tokenizer, mesh, random, process_index=jax.process_index(),
                  process_count=jax.process_count(), say=say)
