"""The data: scikit-learn's 8×8 handwritten digits (1,797 images, shipped as a file inside the
package), a held-out test split, and a non-IID split of the rest into per-worker shards.

Only the coordinator imports scikit-learn; workers get their shard as a blob (wire.py).
"""

from __future__ import annotations

import numpy as np

from .errors import UserError


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Pixels as integers 0..16 (uint8, 1,797 × 64) and labels 0..9."""
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError as exc:
        raise UserError(
            "the coordinator loads the digits data set from scikit-learn, which is not installed",
            hint="pip install 'eran-cloud[coordinator]' (workers never need it)",
        ) from exc
    bunch = sk_load()
    return bunch.data.astype(np.uint8), bunch.target.astype(np.uint8)


def split(
    x: np.ndarray, y: np.ndarray, shards: int, seed: int = 0, test_fraction: float = 0.2, skew: float = 0.8
) -> tuple[tuple[np.ndarray, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """(test set, shards). Non-IID: each shard takes ``skew`` of its rows from the images sorted
    by label (a contiguous run of a few digits) and the rest at random, so every worker sees a
    skewed label mix and no single worker can train the whole model."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    n_skew = int(len(train) * skew)
    skewed, rest = train[:n_skew], train[n_skew:]
    skewed = skewed[np.argsort(y[skewed], kind="stable")]
    parts = [
        np.concatenate([a, b])
        for a, b in zip(np.array_split(skewed, shards), np.array_split(rest, shards), strict=True)
    ]
    return (x[test], y[test]), [(x[p], y[p]) for p in parts]
