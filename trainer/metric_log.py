"""What a training run reports: ``metrics.jsonl``, TensorBoard scalars and the console's progress line."""

from __future__ import annotations

import json
import math
import os
import re
import time


class Progress:
    """Throughput since the previous log point (the first, compiling step excluded) and ETA."""

    def __init__(self, total_steps: int, batch_size: int):
        self.total, self.batch = total_steps, batch_size
        self.started = False

    def start(self, step):
        self.t0 = self.t_last = time.time()
        self.step0 = self.step_last = step
        self.started = True

    def measure(self, step) -> dict:
        if not self.started or step == self.step0:
            return {}
        now = time.time()
        rate = (step - self.step_last) / max(now - self.t_last, 1e-9)
        overall = (step - self.step0) / max(now - self.t0, 1e-9)
        self.t_last, self.step_last = now, step
        return {"steps_per_sec": rate, "pairs_per_sec": rate * self.batch,
                "eta_sec": (self.total - step) / overall}

    def line(self, step, m) -> str:
        if "eta_sec" in m:
            eta = m["eta_sec"]
            speed = (f"{m['steps_per_sec']:.2f} steps/s | {m['pairs_per_sec']:.0f} pairs/s | "
                     f"ETA {int(eta // 3600)}h{int(eta % 3600 // 60):02d}m{int(eta % 60):02d}s")
        else:
            speed = "compiling step"
        return (f"step {step}/{self.total} | {speed} | loss {m['loss']:.4f} "
                f"(i2t {m['loss_i2t']:.3f}, t2i {m['loss_t2i']:.3f}) | in-batch top1 "
                f"{m['i2t_top1']:.3f} | temperature {m['temperature']:.4f} | "
                f"lr {m['learning_rate']:.2e}")


def compiled_memory(compiled) -> dict:
    """Bytes one device holds while running a compiled program, from XLA's memory analysis.

    ``memory/peak_bytes`` = arguments + outputs - donated (aliased) + temporaries:
    the buffers XLA assigned (inputs, outputs, activations, gradients, the
    collectives' buffers), the figure that decides whether a step fits. {}
    where the backend gives no analysis.
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    figures = {"argument_bytes": stats.argument_size_in_bytes, "output_bytes": stats.output_size_in_bytes,
               "alias_bytes": stats.alias_size_in_bytes, "temp_bytes": stats.temp_size_in_bytes}
    figures["peak_bytes"] = (figures["argument_bytes"] + figures["output_bytes"] - figures["alias_bytes"]
                             + figures["temp_bytes"])
    return {f"memory/{key}": float(value) for key, value in figures.items()}


def tensorboard_name(key: str) -> str:
    """A metric key as a valid TensorBoard tag (``[A-Za-z0-9_./-]``): ``R@1`` -> ``R_at_1``."""
    return re.sub(r"[^A-Za-z0-9_./-]", "_", key.replace("@", "_at_"))


class MetricWriter:
    """metrics.jsonl (one object per point) + TensorBoard scalars.

    TensorBoard events are written with tensorboardX, which needs neither the
    tensorboard package nor TensorFlow's summary ops.
    """

    def __init__(self, workdir: str, enabled: bool):
        from tensorboardX import SummaryWriter

        self.enabled = enabled
        if enabled:
            self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
            self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, metrics: dict):
        if not (self.enabled and metrics):
            return
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        for key, value in metrics.items():
            if math.isfinite(value):
                self.tb.add_scalar(tensorboard_name(key), value, step)
        self.tb.flush()

    def close(self):
        if self.enabled:
            self.jsonl.close()
            self.tb.close()
