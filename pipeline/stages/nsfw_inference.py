"""The NSFW score as a step of its own (``--nsfw_accelerator``): Beam's ``RunInference``, on accelerator workers.

    judge ─pending─> RunInference(KeyedModelHandler(NsfwModelHandler)) ─> ApplyNsfwVerdicts ─> rows, ...
                     (resource hint: the accelerator)

Without the option the first pass scores where it reads (``pipeline.stages.judge``),
cheaper on CPU workers: no image bytes leave the fused step. With it, the
file judge applies every cheaper per-record rule and hands each record they
kept on as ``(Pending, (sha256, model input, known score))``:

- ``Pending``: the light row, the record (its image bytes and text: the
  evaluation-index search, the in-corpus embedding and the pair model need
  them after the verdict), the previous build's facts of its image
  (``--reuse``) and where its facts came from;
- the model input: for open_nsfw the reference preparation's 256x256 JPEG
  (``filters.open_nsfw.model_jpeg``, ~10-15 kB; its decode, crop and mean
  are all that is left to the scoring step), for another scorer the image's
  bytes; None when the bytes do not decode;
- the old build's score of the same bytes (``--reuse``), which the scoring
  step takes when its own scorer is the one that made it.

``NsfwModelHandler`` scores one image per model call (a score is then a
function of its image alone, as the fused path's) and remembers the scores
of the last ``filters.nsfw.SCORE_CACHE_SIZE`` images by sha256: a distinct
image costs one score per worker process that meets it (per machine when
Beam shares the model across processes), as on the fused path.
``pipeline.stages.nsfw_step`` makes the step of it, and puts each score
and reason on its row before the rest of the per-record work
(``RecordJudge.judge_scored``): the same code, in the same order, as the
fused path, so the build writes what it writes.
"""

from __future__ import annotations

import threading
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from common.schema import Candidate
from filters import nsfw, open_nsfw
from pipeline.stages.light_rows import LightRow

#: Beam Metrics namespace of RunInference's own counters (inference time, batch sizes, model loads).
METRICS_NAMESPACE = "nsfw_inference"
#: Images per RunInference batch at most: the model is still called once per image.
MAX_BATCH = 64
#: Keys of ``--nsfw_accelerator``'s value (Dataflow's ``worker_accelerator`` syntax).
ACCELERATOR_KEYS = ("type", "count", "machine_type", "install-nvidia-driver", "use_nvidia_mps")


class Pending(NamedTuple):
    """A record every cheaper rule kept, waiting for its NSFW verdict (what crosses to the scoring step)."""

    row: LightRow
    candidate: Candidate
    fact: object = None  # pipeline.readers.previous_build.KnownFacts of the same bytes (--reuse), or None
    outcome: str = ""    # reused|recomputed|new (--reuse), or ""


def jpeg_input(preset, scorer_factory=None) -> bool:
    """Whether the step receives open_nsfw's prepared JPEG (the preset's own open_nsfw), not the image's bytes."""
    return scorer_factory is None and preset.nsfw_model == open_nsfw.MODEL_NAME


def precision(preset) -> str:
    """open_nsfw's precision in the step: ``auto`` is the accelerator's fp32 (int8 is a CPU graph), so that the
    JPEG made on the judge's CPU worker is the one the step's graph expects whatever that worker's CPU."""
    return "int8" if preset.nsfw_precision == "int8" else "fp32"


def decode_side(preset) -> int:
    return open_nsfw.INT8_DECODE_SIDE if precision(preset) == "int8" else 0


def model_input(data: bytes, preset, scorer_factory=None) -> Optional[bytes]:
    """What the scoring step receives for an image's bytes; None where they do not decode."""
    if not jpeg_input(preset, scorer_factory):
        return data
    try:
        return open_nsfw.model_jpeg(data, decode_side(preset))
    except Exception:  # any decoder's error: the fused path's undecodable
        return None


def parse_accelerator(value: str) -> str:
    """``--nsfw_accelerator``'s value checked (``ValueError`` in one line): ``type:T[;count:N][;flags]``."""
    parts = [part.strip() for part in value.split(";")]
    seen = {}
    for part in parts:
        key, _, given = part.partition(":")
        if key not in ACCELERATOR_KEYS:
            raise ValueError(f"{part!r} is not one of {', '.join(ACCELERATOR_KEYS)}")
        if key in seen:
            raise ValueError(f"{key} is given twice")
        if key in ("type", "count", "machine_type") and not given:
            raise ValueError(f"{key} needs a value ({key}:...)")
        if key == "count" and not (given.isdigit() and int(given) >= 1):
            raise ValueError(f"count:{given}: a whole number >= 1")
        seen[key] = given
    if "type" not in seen:
        raise ValueError("it names no accelerator type (e.g. type:nvidia-tesla-t4)")
    return ";".join(parts)


class NsfwModel:
    """The scorer a worker process loaded and its sha256 cache; ``score_batch`` is all the handler calls (also
    through the proxy of a model Beam shares across processes)."""

    def __init__(self, preset, scorer_factory=None, previous_scorers: Sequence[str] = ()):
        self.stage = nsfw.NsfwScoring(preset.nsfw_threshold, preset.nsfw_model, preset.nsfw_unscored,
                                      scorer_factory=scorer_factory, precision=precision(preset))
        self.jpeg = jpeg_input(preset, scorer_factory)
        self.previous_scorers = frozenset(previous_scorers)
        self.lock = threading.Lock()  # Beam's DoFn threads share one model per process

    def load(self) -> "NsfwModel":
        # A rebuild may be given every score: the model waits for an image that needs it (as the fused path's).
        self.stage.load(lazy=bool(self.previous_scorers))
        return self

    def model_id(self) -> str:
        """The scorer's label (what the fused path's outcomes name), or why there is none."""
        return self.stage.label() or self.stage.status

    def score_batch(self, batch: Sequence[Tuple[bytes, Optional[bytes], Optional[float]]],
                    ) -> List[Tuple[bool, Optional[float]]]:
        """``(sha256, model input, known score)`` -> ``(scored, score)`` each: ``(False, None)`` without a
        scorer; ``(True, None)`` for an input that does not decode."""
        if self.stage.scorer is None and self.stage.known is None:
            return [(False, None)] * len(batch)
        if self.previous_scorers and self.stage.label() in self.previous_scorers:
            with self.lock:  # the old build's scores first, as the fused path seeds its cache (--reuse)
                for digest, _, known in batch:
                    if known is not None:
                        self.stage.remember(digest, known)
        done = []
        for digest, data, _ in batch:
            with self.lock:
                found, value = self.stage.cached(digest)
            if not found:
                with self.lock:
                    scorer = self.stage.loaded_scorer()
                value = self._score(scorer, data)
                with self.lock:
                    self.stage.remember(digest, value)
            done.append((True, value))
        return done

    def _score(self, scorer, data: Optional[bytes]) -> Optional[float]:
        """One image, one model call: its score depends on its bytes only."""
        if data is None:
            return None
        if self.jpeg:
            prepare, score = open_nsfw.jpeg_input, scorer.score_prepared
        else:  # the fused path's preparation of the bytes for this scorer
            prepare, score = nsfw.scoring_functions(scorer)
        try:
            prepared = prepare(data)
        except Exception:
            return None
        return float(np.asarray(score([prepared]), np.float32)[0])


class NsfwModelHandler(ModelHandler):
    """``(sha256, model input, known score)`` -> ``PredictionResult(sha256, (scored, score), scorer label)``."""

    def __init__(self, preset, scorer_factory=None, previous_scorers: Sequence[str] = (),
                 large_model: bool = False, min_batch_size: int = 1, max_batch_size: int = MAX_BATCH):
        super().__init__()
        self.preset, self.scorer_factory = preset, scorer_factory
        self.previous_scorers = tuple(previous_scorers)
        self.large_model = large_model
        self.batching = {"min_batch_size": min_batch_size, "max_batch_size": max_batch_size}

    def load_model(self) -> NsfwModel:
        return NsfwModel(self.preset, self.scorer_factory, self.previous_scorers).load()

    def run_inference(self, batch, model, inference_args=None) -> Iterable[PredictionResult]:
        model_id = model.model_id()
        return [PredictionResult(digest, inference, model_id)
                for (digest, _, _), inference in zip(batch, model.score_batch(list(batch)))]

    def get_num_bytes(self, batch) -> int:
        return sum(len(data or b"") for _, data, _ in batch)

    def batch_elements_kwargs(self) -> Dict[str, int]:
        return dict(self.batching)

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE

    def share_model_across_processes(self) -> bool:
        """One copy of the model per machine (Beam's multi-process sharing): an accelerator's memory holds
        one, whatever the number of SDK processes."""
        return self.large_model


def verdict(preset, scored: bool, score: Optional[float]) -> Optional[str]:
    """The fused path's reason for an image's outcome: none unscored, undecodable, pornographic or none."""
    return nsfw.scored_reason(score, preset.nsfw_threshold) if scored else None
