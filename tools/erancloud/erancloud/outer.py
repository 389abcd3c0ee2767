"""The outer optimizer: fold the workers' deltas into the global model.

Each worker sends ``delta = local - global`` after H local steps. The deltas of a round are
first combined into one pseudo-gradient ``g`` (``aggregate``), then DiLoCo's outer step
(SGD with Nesterov momentum, lr 0.7, momentum 0.9) applies it:
``m = mu * m + g;  theta -= lr * (g + mu * m)``. FedAvg is the special case lr 1,
momentum 0 (the new model is the combination of the local models).

Combining (``aggregate``), over the weighted deltas ``x_i = weight_i * delta_i`` of a round:

* ``reference`` (the default; FLTrust, Cao et al. 2021): the coordinator computes its own
  update ``g0`` from the same model with the same local steps, on a small root set of clean
  data it holds (digits: 150 rows of its held-out split, never reported on). Each delta's
  trust is ``max(0, cos(x_i, g0))``, it is rescaled to ``|g0|`` (times its staleness
  weight), and the update is the trust-weighted mean of those and ``g0`` itself (trust 1).
  Nothing in the round being attacked sets the reference: not its median norm, not which
  deltas came first. A delta pointing against the coordinator's own update (a sign flip, the
  negated mean of the honest deltas at any length, colluders in any number) gets trust 0,
  and so does a zero delta; a worker "down-weighted" (trust 0) ``suspect_after`` rounds
  running becomes suspect and its pushes are refused. Measured in bench/bench_erancloud.py
  (a): every attack row at its attacker-absent accuracy, where ``trimmed`` fell to 13 % with
  2 colluders of 5; the price is the honest case (about 93-95 % against 96-97 %: the
  reference pulls towards 150 rows).

The others, relative to the round's median norm ``m``:

* ``trimmed`` (the default): a delta longer than ``trim`` × m (default 4) is trimmed: left
  out of the round altogether; one longer than ``clip`` × m (default 1.5) is clipped: scaled
  down to that length; the rest, clipped ones included, are averaged. An honest majority
  keeps the median norm honest, so no single delta can move the model much further than an
  honest one does. ``trim`` is far above ``clip`` on purpose: an honest worker whose shard
  the model has drifted away from (back after an absence, its classes forgotten) sends a
  delta 2-3 × m; trimmed, it would never be heard again (measured: tests/erancloud/
  test_faults.py), clipped it still teaches the model its classes.
* ``median``: the same norm stage, then the coordinate-wise median of what is left (Yin et
  al. 2018): any minority (f < n/2) is outvoted on every coordinate, at a cost in accuracy
  with non-IID shards (measured in bench/bench_erancloud.py).
* ``mean``: the plain mean (the behaviour before robust aggregation, for trusted setups):
  one bad delta moves the model as far as ``--max-delta-norm`` lets it.

What it assumes, and what it cannot do: an honest majority in every round (f < n/2; with
one or two deltas the median norm is the attacker's to set). With non-IID shards honest
deltas are close to orthogonal (cosine ≈ 0 between workers), so a delta of honest length
pointing the wrong way cannot be told from an honest one by its geometry: clipping bounds
it to ``clip`` × m, it does not remove it (bench/bench_erancloud.py measures both).

A late delta (computed on the model of ``s`` rounds ago) still points downhill; it is
applied with weight ``staleness_weight ** s`` (default 0.75 for one round late; beyond
``max_staleness`` it is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

AGGREGATES = ("reference", "trimmed", "median", "mean")
OPPOSED_COSINE = 0.2  # a cosine at or below minus this with the reference counts as opposed


@dataclass(frozen=True)
class Judged:
    """What the combination did to one delta: its norm (weighted, before clipping) and
    whether it was clipped or trimmed."""

    norm: float
    clipped: bool = False
    trimmed: bool = False
    trust: float = 1.0  # ``reference``: max(0, cosine with the coordinator's own update)
    cosine: float = 1.0  # ``reference``: the cosine itself (-1 for a zero delta)

    @property
    def verdict(self) -> str:
        if self.trust <= 0.0:
            return "down-weighted"
        return "trimmed" if self.trimmed else "clipped" if self.clipped else "applied"

    @property
    def opposed(self) -> bool:
        """Left out for pointing against the coordinator's own update (or for being empty):
        what counts towards "suspect". An honest delta near convergence is noise, cosine
        around 0 either way; an attacker's points away."""
        return self.trimmed or self.cosine <= -OPPOSED_COSINE


@dataclass(frozen=True)
class Outer:
    kind: str = "nesterov"  # "nesterov" | "fedavg"
    lr: float = 0.7
    momentum: float = 0.9
    staleness_weight: float = 0.75  # bench/bench_erancloud.py (c): best of 0.5 / 0.75 / 1.0
    max_staleness: int = 1
    aggregate: str = "reference"
    clip: float = 1.5  # × the round's median norm: scaled down to this
    trim: float = 4.0  # × the round's median norm: left out

    @classmethod
    def fedavg(cls, **kw: object) -> Outer:
        return cls(kind="fedavg", lr=1.0, momentum=0.0, **kw)  # type: ignore[arg-type]

    def weight(self, staleness: int) -> float:
        if staleness < 0 or staleness > self.max_staleness:
            return 0.0
        return float(self.staleness_weight**staleness)

    def combine(
        self,
        deltas: list[tuple[np.ndarray, float]],
        reference: np.ndarray | None = None,
        references: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, list[Judged]]:
        """The combined update (float64; the model moves by it) and what happened to each delta.
        ``reference``: the coordinator's own update of this round (required by the ``reference``
        aggregate); ``references``: per delta, the coordinator's update of the round that delta
        was computed for (a late delta is judged against the model it started from; default:
        ``reference`` for all)."""
        if self.aggregate == "reference":
            if reference is None:
                raise ValueError("the reference aggregate needs the coordinator's own update")
            return self._by_reference(deltas, reference, references or [reference] * len(deltas))
        xs = np.stack([np.float64(w) * d.astype(np.float64) for d, w in deltas])
        n = len(xs)
        norms = np.linalg.norm(xs, axis=1)
        if self.aggregate == "mean":
            # The sum divided by the count, as before (a late delta shrinks the step instead of
            # tilting the mix: bench/bench_erancloud.py (c) measured it better than renormalising).
            return xs.sum(axis=0) / n, [Judged(float(v)) for v in norms]
        median = float(np.median(norms))
        trimmed = norms > self.trim * median
        clipped = ~trimmed & (norms > self.clip * median)
        if np.any(clipped):
            xs[clipped] *= (self.clip * median / norms[clipped])[:, None]
        kept = xs[~trimmed]  # never empty: the median-norm delta is always kept
        combined = kept.sum(axis=0) / len(kept) if self.aggregate == "trimmed" else np.median(kept, axis=0)
        return combined, [Judged(float(norms[i]), bool(clipped[i]), bool(trimmed[i])) for i in range(n)]

    @staticmethod
    def _by_reference(
        deltas: list[tuple[np.ndarray, float]], reference: np.ndarray, references: list[np.ndarray]
    ) -> tuple[np.ndarray, list[Judged]]:
        ref = reference.astype(np.float64)
        ref_norm = float(np.linalg.norm(ref))
        xs = np.stack([d.astype(np.float64) for d, _ in deltas])
        weights = np.array([float(w) for _, w in deltas])
        norms = np.linalg.norm(xs, axis=1)
        refs = np.stack([r.astype(np.float64) for r in references])
        ref_norms = np.linalg.norm(refs, axis=1)
        if ref_norm == 0.0:  # nothing to compare with: nothing moves
            judged = [Judged(float(w * n), trust=0.0, cosine=0.0) for w, n in zip(weights, norms, strict=True)]
            return np.zeros_like(ref), judged
        scale = np.where(norms > 0, norms, 1.0) * np.where(ref_norms > 0, ref_norms, 1.0)
        cosine = np.where((norms > 0) & (ref_norms > 0), np.einsum("ij,ij->i", xs, refs) / scale, -1.0)
        trust = np.maximum(cosine, 0.0)
        scaled = xs * (weights * ref_norm / np.where(norms > 0, norms, 1.0))[:, None]
        combined = (ref + (trust[:, None] * scaled).sum(axis=0)) / (1.0 + float(trust.sum()))
        judged = [
            Judged(float(w * n), trust=float(t), cosine=float(c))
            for w, n, t, c in zip(weights, norms, trust, cosine, strict=True)
        ]
        return combined, judged

    def step(
        self,
        params: np.ndarray,
        momentum: np.ndarray,
        deltas: list[tuple[np.ndarray, float]],
        reference: np.ndarray | None = None,
        references: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(new params, new momentum); inputs are not modified. ``deltas``: (delta, weight)."""
        new, mom, _ = self.step_judged(params, momentum, deltas, reference, references)
        return new, mom

    def step_judged(
        self,
        params: np.ndarray,
        momentum: np.ndarray,
        deltas: list[tuple[np.ndarray, float]],
        reference: np.ndarray | None = None,
        references: list[np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[Judged]]:
        """``step``, and what the combination did to each delta of weight > 0 (same order)."""
        keep = [i for i, (_, w) in enumerate(deltas) if w > 0]
        if not keep:
            return params.copy(), momentum.copy(), []
        live = [deltas[i] for i in keep]
        refs = [references[i] for i in keep] if references is not None else None
        combined, judged = self.combine(live, reference, refs)
        g = -combined
        if self.kind == "fedavg":
            return (params - self.lr * g).astype(np.float32), momentum.copy(), judged
        m = self.momentum * momentum.astype(np.float64) + g
        new = params - self.lr * (g + self.momentum * m)
        return new.astype(np.float32), m.astype(np.float32), judged

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "lr": self.lr,
            "momentum": self.momentum,
            "staleness_weight": self.staleness_weight,
            "max_staleness": self.max_staleness,
            "aggregate": self.aggregate,
            "clip": self.clip,
            "trim": self.trim,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Outer:
        """From the round state. A state written before robust aggregation existed keeps the
        mean it was trained with (its replay must stay exact)."""
        aggregate = str(data.get("aggregate", "mean"))
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate {aggregate[:20]!r} is not one of {AGGREGATES}")
        return cls(
            kind=str(data["kind"]),
            lr=float(data["lr"]),  # type: ignore[arg-type]
            momentum=float(data["momentum"]),  # type: ignore[arg-type]
            staleness_weight=float(data.get("staleness_weight", 0.75)),  # type: ignore[arg-type]
            max_staleness=int(data.get("max_staleness", 1)),  # type: ignore[call-overload]
            aggregate=aggregate,
            clip=float(data.get("clip", 1.5)),  # type: ignore[arg-type]
            trim=float(data.get("trim", 4.0)),  # type: ignore[arg-type]
        )
