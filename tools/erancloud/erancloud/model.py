"""The model: a small numpy MLP (one tanh hidden layer, softmax output) on a flat float32
parameter vector, so that models, deltas and momenta are all the same plain array."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .inner import InnerOpt, Schedule, local_steps


@dataclass(frozen=True)
class MLP:
    inputs: int = 64
    hidden: int = 32
    classes: int = 10

    @property
    def count(self) -> int:
        return self.inputs * self.hidden + self.hidden + self.hidden * self.classes + self.classes

    def init(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        w1 = rng.normal(0, 1 / np.sqrt(self.inputs), (self.inputs, self.hidden))
        w2 = rng.normal(0, 1 / np.sqrt(self.hidden), (self.hidden, self.classes))
        parts = [w1.ravel(), np.zeros(self.hidden), w2.ravel(), np.zeros(self.classes)]
        return np.concatenate(parts).astype(np.float32)

    def unpack(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        i, h, c = self.inputs, self.hidden, self.classes
        a = i * h
        w1 = p[:a].reshape(i, h)
        b1 = p[a : a + h]
        w2 = p[a + h : a + h + h * c].reshape(h, c)
        b2 = p[a + h + h * c :]
        return w1, b1, w2, b2

    def logits(self, p: np.ndarray, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self.unpack(p)
        return np.tanh(x @ w1 + b1) @ w2 + b2

    def accuracy(self, p: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(np.argmax(self.logits(p, x), axis=1) == y))

    def grad(self, p: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient (same layout as ``p``)."""
        w1, b1, w2, b2 = self.unpack(p)
        hid = np.tanh(x @ w1 + b1)
        z = hid @ w2 + b2
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        prob = e / e.sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(-np.mean(np.log(prob[np.arange(n), y] + 1e-12)))
        dz = prob
        dz[np.arange(n), y] -= 1
        dz /= n
        gw2 = hid.T @ dz
        gb2 = dz.sum(axis=0)
        dh = (dz @ w2.T) * (1 - hid**2)
        gw1 = x.T @ dh
        gb1 = dh.sum(axis=0)
        return loss, np.concatenate([gw1.ravel(), gb1, gw2.ravel(), gb2]).astype(np.float32)


def batch_indices(seed: int, round_no: int, step: int, rows: int, batch: int) -> np.ndarray:
    """The minibatch of one local step, a pure function of (seed, round, step): a job resumed
    from a checkpoint draws exactly the batches it would have drawn without the interruption."""
    return np.random.default_rng([seed, round_no, step]).integers(0, rows, size=min(batch, rows))


def hash_worker(worker: str) -> int:
    """A stable small integer from the worker id (Python's hash() is salted per process): the
    seed of its batch order."""
    import zlib

    return zlib.crc32(worker.encode()) % 1000


def train_local(
    model: MLP,
    params: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    *,
    steps: int,
    lr: float,
    batch: int,
    seed: int,
    round_no: int,
    start: int = 0,
    stop: Callable[[], bool] = lambda: False,
    opt: InnerOpt | None = None,
    schedule: Schedule | None = None,
) -> tuple[np.ndarray, int, float]:
    """The inner optimizer ``opt`` (default plain SGD) from local step ``start`` to ``steps``;
    returns (params, steps done, last loss). The lr is ``schedule`` at the global step
    ``round_no * steps + step`` (default: ``lr`` throughout). ``stop()`` is checked before
    every step: a vacated job stops between steps, never inside one."""
    p = params.astype(np.float32, copy=True)
    losses = [float("nan")]

    def grad(q: np.ndarray, step: int) -> np.ndarray:
        idx = batch_indices(seed, round_no, step, len(y), batch)
        loss, g = model.grad(q, x[idx], y[idx])
        losses[0] = loss
        return g

    sched = schedule or Schedule(lr)
    done = local_steps(p, grad, opt or InnerOpt(), lambda k: sched.at(round_no * steps + k), start, steps, stop)
    return p, done, losses[0]
