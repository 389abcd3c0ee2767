"""The inner optimizer: what a worker runs for its H local steps, and its learning-rate schedule.

DiLoCo (Douillard et al. 2023) pairs an inner optimizer with state (AdamW there) that each
worker keeps across rounds with the outer Nesterov step of outer.py, and runs the inner lr on
a warmup-then-cosine schedule over the whole training (the global step is round × H + local
step, so every worker is at the same point of it). Kinds (``--inner``):

* ``sgd``: plain SGD, no state (the default: the digits model needs nothing more, and a
  round's update then depends only on the model and the batches);
* ``nesterov``: SGD with Nesterov momentum 0.9 (``m = 0.9 m + g; p -= lr (g + 0.9 m)``);
* ``adamw``: AdamW, betas 0.9 / 0.95, decoupled weight decay 0.1, eps 1e-8 (DiLoCo's).

The state (momentum, Adam moments) lives in the worker process across rounds; a worker
restarted (or a job requeued by ERAN-GRID) starts it from zero, as a new worker would.
bench/bench_erancloud.py (b) runs this same code on both sides of its comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

KINDS = ("sgd", "nesterov", "adamw")
SCHEDULES = ("constant", "cosine")
MOMENTUM = 0.9
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
EPS = 1e-8


@dataclass
class InnerOpt:
    """One worker's inner optimizer and its state (kept across rounds by its owner)."""

    kind: str = "sgd"
    m: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    v: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    t: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"inner optimizer {self.kind[:20]!r} is not one of {KINDS}")

    def step(self, p: np.ndarray, g: np.ndarray, lr: float) -> None:
        """One update of ``p`` in place with gradient ``g``."""
        if self.kind == "sgd":
            p -= np.float32(lr) * g
            return
        if self.m.shape != p.shape:
            self.m, self.v, self.t = np.zeros_like(p), np.zeros_like(p), 0
        if self.kind == "nesterov":
            self.m = np.float32(MOMENTUM) * self.m + g
            p -= np.float32(lr) * (g + np.float32(MOMENTUM) * self.m)
            return
        self.t += 1
        b1, b2 = BETAS
        self.m = np.float32(b1) * self.m + np.float32(1 - b1) * g
        self.v = np.float32(b2) * self.v + np.float32(1 - b2) * g * g
        mh = self.m / np.float32(1 - b1**self.t)
        vh = self.v / np.float32(1 - b2**self.t)
        p -= np.float32(lr) * (mh / (np.sqrt(vh) + np.float32(EPS)) + np.float32(WEIGHT_DECAY) * p)


@dataclass(frozen=True)
class Schedule:
    """The inner lr at a global step: linear warmup over ``warmup`` steps, then constant or
    cosine decay to 0 at step ``total`` (the run's last)."""

    lr: float
    warmup: int = 0
    kind: str = "constant"
    total: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule {self.kind[:20]!r} is not one of {SCHEDULES}")

    def at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.kind == "constant" or self.total <= self.warmup:
            return self.lr
        done = min(step - self.warmup, self.total - self.warmup) / (self.total - self.warmup)
        return float(self.lr * 0.5 * (1 + math.cos(math.pi * done)))


def local_steps(
    p: np.ndarray,
    grad: Callable[[np.ndarray, int], np.ndarray],
    opt: InnerOpt,
    lr_at: Callable[[int], float],
    start: int,
    stop_at: int,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Local steps ``start`` .. ``stop_at`` on ``p`` in place; ``grad(p, step)`` is the
    gradient of the step's batch, ``lr_at(step)`` its lr. ``stop()`` is checked before every
    step (a vacated job stops between steps). Returns the steps done."""
    step = start
    while step < stop_at:
        if stop():
            break
        opt.step(p, grad(p, step), lr_at(step))
        step += 1
    return step


def from_train(train: dict[str, object]) -> tuple[str, Schedule]:
    """(inner kind, lr schedule) from the round state's ``train`` (a state written before these
    fields existed trains as it did: plain SGD at a constant lr)."""
    total = int(train.get("total_steps", 0))  # type: ignore[call-overload]
    sched = Schedule(float(train["lr"]), int(train.get("warmup", 0)), str(train.get("schedule", "constant")), total)  # type: ignore[arg-type,call-overload]
    return str(train.get("inner", "sgd")), sched


def check_train(train: dict[str, object]) -> str | None:
    """The reason the optional inner-optimizer fields of ``train`` are unusable, or None."""
    if train.get("inner", "sgd") not in KINDS:
        return f"train.inner is not one of {KINDS}"
    if train.get("schedule", "constant") not in SCHEDULES:
        return f"train.schedule is not one of {SCHEDULES}"
    for key in ("warmup", "total_steps"):
        value = train.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10**9:
            return f"train.{key} is not a step count"
    return None
