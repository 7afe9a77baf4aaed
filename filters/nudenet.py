"""NudeNet's detector as an NSFW scorer (``nsfw_model=nudenet``, the optional ``[nsfw]`` extra, AGPL-3.0).

It detects body-part boxes, not "pornography": an image's score is the
highest confidence of any box whose class is in ``PORNOGRAPHIC_CLASSES``.
``filters.nsfw`` registers it beside open_nsfw.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np
from PIL import Image

#: NudeNet 3.x (``320n.onnx``) output classes, in the model's output order:
#: row ``4 + i`` of the detector output is the confidence of class ``i``.
#: tests/filters/test_nsfw.py checks this against the installed package.
NUDENET_CLASSES = (
    "FEMALE_GENITALIA_COVERED",
    "FACE_FEMALE",
    "BUTTOCKS_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "FEMALE_GENITALIA_EXPOSED",
    "MALE_BREAST_EXPOSED",
    "ANUS_EXPOSED",
    "FEET_EXPOSED",
    "BELLY_COVERED",
    "FEET_COVERED",
    "ARMPITS_COVERED",
    "ARMPITS_EXPOSED",
    "FACE_MALE",
    "BELLY_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "ANUS_COVERED",
    "FEMALE_BREAST_COVERED",
    "BUTTOCKS_COVERED",
)

#: Classes whose detection makes an image pornographic. MALE_BREAST_EXPOSED
#: and BELLY_EXPOSED are left out on purpose: they fire on beach, sport and
#: swimwear photos, which ALIGN-style corpora keep.
PORNOGRAPHIC_CLASSES = (
    "FEMALE_GENITALIA_EXPOSED",
    "MALE_GENITALIA_EXPOSED",
    "FEMALE_BREAST_EXPOSED",
    "BUTTOCKS_EXPOSED",
    "ANUS_EXPOSED",
)




def letterbox_blob(images: Sequence[Image.Image], size: int) -> np.ndarray:
    """NudeNet's preprocessing, batched: float32 [N, 3, size, size] in [0, 1].

    Like ``nudenet._read_image``: pad the RGB image with black at the right or
    bottom to a square, resize the square to ``size`` (bilinear), scale by
    1/255. Padding at one corner (not centring) keeps the model's boxes in
    the original image's coordinates.
    """
    import cv2  # a dependency of nudenet

    batch = np.empty((len(images), 3, size, size), np.float32)
    for i, img in enumerate(images):
        rgb = np.asarray(img.convert("RGB"))
        height, width = rgb.shape[:2]
        side = max(height, width)
        square = cv2.copyMakeBorder(rgb, 0, side - height, 0, side - width, cv2.BORDER_CONSTANT)
        resized = cv2.resize(square, (size, size), interpolation=cv2.INTER_LINEAR)
        batch[i] = resized.transpose(2, 0, 1) * np.float32(1.0 / 255.0)
    return batch


def detections_to_scores(output: np.ndarray, class_indices: Sequence[int]) -> np.ndarray:
    """Raw detector output [N, 4 + C, A] -> float32 [N] image scores.

    Each of the A anchor boxes is labelled with its most confident class (as
    NudeNet's own post-processing does). The image score is the highest
    confidence among boxes labelled with one of ``class_indices``, 0 if none.
    Non-maximum suppression only removes lower-scoring overlapping boxes, so
    it cannot change this maximum and is skipped.
    """
    if output.ndim != 3 or output.shape[1] <= 4:
        raise ValueError(f"expected detector output [N, 4 + classes, anchors], got {output.shape}")
    class_scores = output[:, 4:, :]
    best = class_scores.max(axis=1)
    label = class_scores.argmax(axis=1)
    counted = np.isin(label, np.asarray(class_indices, dtype=np.int64))
    scores = np.where(counted, best, 0.0).max(axis=1)
    return np.clip(scores, 0.0, 1.0).astype(np.float32)


class NudenetScorer:
    """NudeNet 3.x detector (``320n.onnx`` from the wheel) on CPU via onnxruntime."""

    name = "nudenet"

    def __init__(
        self,
        classes: Sequence[str] = PORNOGRAPHIC_CLASSES,
        model_path: Optional[str] = None,
        input_size: int = 320,
        batch_size: int = 16,
        num_threads: int = 1,
    ):
        """``num_threads=1`` because Beam workers already run one SDK process
        per core (Dataflow) and more threads only oversubscribe: measured here,
        1 thread was faster than onnxruntime's default under load. 0 lets
        onnxruntime choose (all cores). ``model_path``/``input_size`` select another NudeNet ONNX export
        (e.g. the 640m model, which is not in the wheel)."""
        import nudenet
        import onnxruntime

        unknown = sorted(set(classes) - set(NUDENET_CLASSES))
        if unknown:
            raise ValueError(f"not NudeNet classes: {unknown}")
        self.classes = tuple(classes)
        self._class_indices = [NUDENET_CLASSES.index(c) for c in self.classes]
        self.input_size = input_size
        self.batch_size = batch_size
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # keep worker logs free of graph-optimiser chatter
        path = model_path or os.path.join(os.path.dirname(nudenet.__file__), "320n.onnx")
        self._session = onnxruntime.InferenceSession(
            path, sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._input_name = self._session.get_inputs()[0].name

    def raw_output(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Detector output [N, 4 + 18, anchors] (boxes then class confidences)."""
        outputs = []
        for start in range(0, len(images), self.batch_size):
            blob = letterbox_blob(images[start : start + self.batch_size], self.input_size)
            outputs.append(self._session.run(None, {self._input_name: blob})[0])
        return np.concatenate(outputs, axis=0)

    def score(self, images: List[Image.Image]) -> np.ndarray:
        if not images:
            return np.zeros((0,), np.float32)
        return detections_to_scores(self.raw_output(images), self._class_indices)
