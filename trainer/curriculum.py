"""TOnICS: the curriculum's sampling distribution over ontology nodes, its refresh, the per-step choice.

"Curriculum Learning for Data-Efficient Vision-Language Alignment" (TOnICS,
section 3): node 0 is the root (``entity``: an ordinary random
minibatch), nodes 1..K the object classes (a minibatch whose pairs all name
that class). ``P_S(root) = 1`` at the start. Every ``refresh_every`` steps
image retrieval is evaluated on ``refresh_instances`` held-out pairs; if its
accuracy is at least ``refresh_threshold``,

    P_S(root) <- alpha * P_S(root)
    P_S(o)    <- P_S(o) + (1 - alpha) * P_S(root) * |X(o)| / sum |X(o')|

as long as ``P_S(root)`` does not fall below ``beta``. A refresh that would
cross ``beta`` moves P_S(root) down to ``beta`` exactly (and the same split
of what it frees); after that nothing moves. Defaults are the paper's:
every 5K steps, 100 instances, accuracy 0.9, alpha 0.9, beta 0.2.

Every host draws the same node at a step: the choice is a function of
``(seed, step)`` and of ``P_S``, which changes only at a refresh, from an
evaluation every host computes identically. ``CurriculumState`` is plain JSON
(saved in the checkpoint's ``meta``), so a resumed run continues with the
same P_S, refresh history and choice counts.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence

import numpy as np

ROOT = 0


@dataclasses.dataclass
class CurriculumState:
    """``probs[0]`` is P_S(root); ``probs[1 + k]`` is P_S of class ``classes[k]``."""

    classes: List[str]
    sizes: List[int]              # |X(o)| per class (train pairs naming it)
    probs: List[float]
    refreshes: List[dict]         # {"step", "accuracy", "p_root"} of each refresh done
    choices: Dict[str, int]       # node name -> steps that drew it (root under "root")

    @classmethod
    def start(cls, classes: Sequence[str], sizes: Sequence[int]) -> "CurriculumState":
        if len(classes) != len(sizes):
            raise ValueError("one size per class")
        return cls(list(classes), [int(s) for s in sizes], [1.0] + [0.0] * len(classes), [], {})

    @property
    def p_root(self) -> float:
        return self.probs[ROOT]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "CurriculumState":
        return cls(list(data["classes"]), [int(s) for s in data["sizes"]], [float(p) for p in data["probs"]],
                   [dict(r) for r in data["refreshes"]], {k: int(v) for k, v in data["choices"].items()})

    def node_name(self, node: int) -> str:
        return "root" if node == ROOT else self.classes[node - 1]


def refreshed_probs(probs: Sequence[float], sizes: Sequence[int], alpha: float, beta: float) -> List[float]:
    """One curriculum refresh of P_S (the paper's update, floored at ``beta``; see the module doc).

    Classes with no pair (``|X(o)| = 0``) get no mass. If no class has a pair,
    or P_S(root) is already at the floor, nothing moves.
    """
    if not 0.0 < alpha < 1.0 or not 0.0 <= beta <= 1.0:
        raise ValueError(f"need 0 < alpha < 1 and 0 <= beta <= 1, got alpha={alpha}, beta={beta}")
    probs = [float(p) for p in probs]
    sizes = np.asarray(sizes, dtype=np.float64)
    total = float(sizes.sum())
    new_root = max(alpha * probs[ROOT], beta)
    freed = probs[ROOT] - new_root
    if total <= 0 or freed <= 0:
        return probs
    probs[ROOT] = new_root
    for k, size in enumerate(sizes):
        probs[1 + k] += freed * float(size) / total
    return probs


def maybe_refresh(state: CurriculumState, step: int, accuracy: float, *, threshold: float, alpha: float,
                  beta: float) -> bool:
    """Refreshes ``state`` in place if ``accuracy >= threshold`` and mass can still move; returns whether it did."""
    if accuracy < threshold:
        return False
    new = refreshed_probs(state.probs, state.sizes, alpha, beta)
    if new == state.probs:
        return False
    state.probs = new
    state.refreshes.append({"step": int(step), "accuracy": float(accuracy), "p_root": new[ROOT]})
    return True


def choose_node(probs: Sequence[float], seed: int, step: int) -> int:
    """The node drawn at ``step``: the same on every host (seeded by ``(seed, step)`` only)."""
    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum()  # float sums of the split may be off by an ulp
    rng = np.random.default_rng([int(seed), int(step), 0x70C5])
    return int(rng.choice(len(p), p=p))
