"""``client --dry-run``: one local round with no coordinator, labelled DRY-RUN everywhere.

It trains the same model the same way on synthetic data made here (ten Gaussian clusters in
the digits' 64-dimensional pixel range), so an operator can check that numpy works and how
long H steps take, without any network. Its record says ``"mode": "DRY-RUN"``; every line it
prints starts with ``DRY-RUN:``. It is only ever started by the explicit flag: no live failure
falls back to it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .model import MLP, train_local
from .status import DRY_RUN_GLOB
from .store import write_atomic

Log = Callable[[str], None]


def synthetic(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.0, 1.0, (10, 64))
    y = rng.integers(0, 10, rows)
    x = np.clip(centres[y] + rng.normal(0, 0.15, (rows, 64)), 0, 1).astype(np.float32)
    return x, y.astype(np.int64)


def run(out_dir: Path, steps: int, log: Log, seed: int = 0) -> dict[str, Any]:
    model = MLP()
    x, y = synthetic(512, seed)
    params = model.init(seed)
    t0 = time.monotonic()
    local, done, loss = train_local(model, params, x, y, steps=steps, lr=0.1, batch=32, seed=seed, round_no=0)
    took = time.monotonic() - t0
    delta = local - params
    result = {
        "mode": "DRY-RUN",
        "note": "DRY-RUN: a local round without a coordinator; not a contribution, not a live worker",
        "steps": done,
        "loss": round(loss, 4),
        "accuracy_on_its_own_synthetic_data": round(model.accuracy(local, x, y), 4),
        "delta_norm": round(float(np.linalg.norm(delta)), 4),
        "seconds": round(took, 3),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    log(f"DRY-RUN: {done} local steps on synthetic data in {took:.2f} s, loss {loss:.3f} (no coordinator)")
    name = DRY_RUN_GLOB.replace("*", f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}")
    write_atomic(out_dir / name, (json.dumps(result, sort_keys=True) + "\n").encode())
    log(f"DRY-RUN: record {out_dir / name}")
    return result
