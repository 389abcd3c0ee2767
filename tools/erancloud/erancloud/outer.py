"""The outer optimizer: fold the workers' deltas into the global model.

Each worker sends ``delta = local - global`` after H local steps; the pseudo-gradient is
``g = -mean(weight * delta)``. DiLoCo's outer step is SGD with Nesterov momentum
(lr 0.7, momentum 0.9):  ``m = mu * m + g;  theta -= lr * (g + mu * m)``. FedAvg is the
special case lr 1, momentum 0 (the new model is the mean of the local models).

A late delta (computed on the model of ``s`` rounds ago) still points downhill; it is
applied with weight ``staleness_weight ** s`` (default 0.75 for one round late; beyond
``max_staleness`` it is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Outer:
    kind: str = "nesterov"  # "nesterov" | "fedavg"
    lr: float = 0.7
    momentum: float = 0.9
    staleness_weight: float = 0.75  # bench/bench_erancloud.py (c): best of 0.5 / 0.75 / 1.0
    max_staleness: int = 1

    @classmethod
    def fedavg(cls) -> Outer:
        return cls(kind="fedavg", lr=1.0, momentum=0.0)

    def weight(self, staleness: int) -> float:
        if staleness < 0 or staleness > self.max_staleness:
            return 0.0
        return float(self.staleness_weight**staleness)

    def step(
        self, params: np.ndarray, momentum: np.ndarray, deltas: list[tuple[np.ndarray, float]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(new params, new momentum); inputs are not modified. ``deltas``: (delta, weight)."""
        live = [(d, w) for d, w in deltas if w > 0]
        if not live:
            return params.copy(), momentum.copy()
        # The mean over the deltas received, each scaled by its weight: a late delta makes the
        # step smaller instead of tilting the mix towards it (the weights are not renormalised;
        # bench/bench_erancloud.py (c) measured this better than dividing by the weight sum).
        g = -sum(np.float64(w) * d.astype(np.float64) for d, w in live) / len(live)
        if self.kind == "fedavg":
            return (params - self.lr * g).astype(np.float32), momentum.copy()
        m = self.momentum * momentum.astype(np.float64) + g
        new = params - self.lr * (g + self.momentum * m)
        return new.astype(np.float32), m.astype(np.float32)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "lr": self.lr,
            "momentum": self.momentum,
            "staleness_weight": self.staleness_weight,
            "max_staleness": self.max_staleness,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Outer:
        return cls(
            kind=str(data["kind"]),
            lr=float(data["lr"]),  # type: ignore[arg-type]
            momentum=float(data["momentum"]),  # type: ignore[arg-type]
            staleness_weight=float(data.get("staleness_weight", 0.75)),  # type: ignore[arg-type]
            max_staleness=int(data.get("max_staleness", 1)),  # type: ignore[call-overload]
        )
