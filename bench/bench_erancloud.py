"""ERANCLOUD: Local-SGD (outer Nesterov over pseudo-gradients, DiLoCo) against synchronous
data-parallel SGD, side by side in one run, at an equal number of training samples.

    .venv/bin/python bench/bench_erancloud.py [--steps 3000] [--quick]

(a) Sanity: the digits MLP (erancloud.model, the coordinator's own data split: 4 non-IID
    shards), test accuracy, sync vs Local-SGD H = 20. Both land near 97 %: this line cannot
    tell good aggregation from bad, it only shows the real model trains.
(b) A character-level language model (Bengio-style MLP over an 8-character context, numpy) on
    the text of the standard library's ``pydoc_data.topics``, cut into 4 contiguous shards
    (topic skew); validation loss (nats/char) on held-out text from every shard. Synchronous:
    each step, every worker computes a gradient on 32 samples of its shard, the gradients are
    averaged (global batch 128). Local-SGD: every worker runs H plain-SGD steps of 32 on its
    shard from the global model, the outer step (erancloud.outer.Outer: Nesterov lr 0.7,
    momentum 0.9) folds the mean delta. Equal samples: --steps × 128 for every line.
    Bytes per sample: the blobs (erancloud.wire) each worker sends and receives.
(c) The same at H = 50 with one of the four workers yielding in every round (its delta is a
    round late: computed on the previous global model): dropped (the prototype's rule), and
    applied late with the coordinator's default staleness weight (0.75: measured best of
    0.5 / 0.75 / 1.0), scaled and not renormalised (erancloud.outer).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# One BLAS thread: the four "workers" are simulated in turn, and on a loaded 2-core machine
# BLAS threads spinning against each other cost far more than they give on these small matrices.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools" / "erancloud"))

from erancloud import data, wire  # noqa: E402
from erancloud.model import MLP, train_local  # noqa: E402
from erancloud.outer import Outer  # noqa: E402

WORKERS = 4
BATCH = 32
CONTEXT = 8


# -- (b) the character-level model ----------------------------------------------------------
class CharMLP:
    """emb (V × d) → concat of CONTEXT embeddings → tanh hidden → softmax over V."""

    def __init__(self, vocab: int, dim: int = 16, hidden: int = 256) -> None:
        self.v, self.d, self.h = vocab, dim, hidden
        self.shapes = [(vocab, dim), (CONTEXT * dim, hidden), (hidden,), (hidden, vocab), (vocab,)]
        self.count = sum(int(np.prod(s)) for s in self.shapes)

    def init(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        parts = [
            rng.normal(0, 1.0, self.shapes[0]),
            rng.normal(0, 1 / np.sqrt(CONTEXT * self.d), self.shapes[1]),
            np.zeros(self.shapes[2]),
            rng.normal(0, 1 / np.sqrt(self.h), self.shapes[3]),
            np.zeros(self.shapes[4]),
        ]
        return np.concatenate([p.ravel() for p in parts]).astype(np.float32)

    def unpack(self, p: np.ndarray) -> list[np.ndarray]:
        out, i = [], 0
        for s in self.shapes:
            n = int(np.prod(s))
            out.append(p[i : i + n].reshape(s))
            i += n
        return out

    def loss(self, p: np.ndarray, ctx: np.ndarray, nxt: np.ndarray) -> float:
        emb, w1, b1, w2, b2 = self.unpack(p)
        hid = np.tanh(emb[ctx].reshape(len(ctx), -1) @ w1 + b1)
        z = hid @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(nxt)), nxt].mean())

    def grad(self, p: np.ndarray, ctx: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        emb, w1, b1, w2, b2 = self.unpack(p)
        n = len(nxt)
        x = emb[ctx].reshape(n, -1)
        hid = np.tanh(x @ w1 + b1)
        z = hid @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        dz = e / e.sum(axis=1, keepdims=True)
        dz[np.arange(n), nxt] -= 1
        dz /= n
        dh = (dz @ w2.T) * (1 - hid**2)
        dx = (dh @ w1.T).reshape(n, CONTEXT, self.d)
        gemb = np.zeros_like(emb)
        np.add.at(gemb, ctx, dx)
        parts = [gemb, x.T @ dh, dh.sum(0), hid.T @ dz, dz.sum(0)]
        return np.concatenate([q.ravel() for q in parts]).astype(np.float32)


def load_text() -> tuple[list[np.ndarray], np.ndarray, int]:
    """(4 contiguous training shards, validation text from every shard's end, vocabulary size)."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    chars = sorted(set(text))
    codes = np.array([chars.index(c) for c in chars], np.int64)  # noqa: F841 - documents the mapping
    table = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((table[c] for c in text), np.int64, len(text))
    shards, val = [], []
    for part in np.array_split(ids, WORKERS):
        cut = int(len(part) * 0.95)
        shards.append(part[:cut])
        val.append(part[cut:])
    return shards, np.concatenate(val), len(chars)


def windows(text: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ctx = text[idx[:, None] + np.arange(CONTEXT)[None, :]]
    return ctx, text[idx + CONTEXT]


class Lm:
    def __init__(self, steps: int, lr: float, seed: int = 0) -> None:
        self.shards, val, vocab = load_text()
        self.model = CharMLP(vocab)
        self.steps, self.lr, self.seed = steps, lr, seed
        rng = np.random.default_rng(99)
        vidx = rng.integers(0, len(val) - CONTEXT - 1, 20_000)
        self.val = windows(val, vidx)

    def lr_at(self, step: int) -> float:
        """Cosine decay over the run's steps (the same schedule for every line)."""
        return self.lr * 0.5 * (1 + np.cos(np.pi * min(step, self.steps) / self.steps))

    def batch(self, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        text = self.shards[worker]
        idx = np.random.default_rng([self.seed, worker, step]).integers(0, len(text) - CONTEXT - 1, BATCH)
        return windows(text, idx)

    def val_loss(self, p: np.ndarray) -> float:
        return self.model.loss(p, *self.val)

    def sync(self) -> float:
        p = self.model.init(self.seed)
        for step in range(self.steps):
            g = sum(self.model.grad(p, *self.batch(w, step)) for w in range(WORKERS)) / WORKERS
            p -= np.float32(self.lr_at(step)) * g
        return self.val_loss(p)

    def local(self, h: int, outer: Outer, yielding: str = "", prox: float = 0.0) -> float:
        """Local-SGD; ``yielding``: "" (all on time), "drop" or "late" for worker 0."""
        p = self.model.init(self.seed)
        mom = np.zeros_like(p)
        prev = p.copy()
        rounds = self.steps // h
        for r in range(rounds):
            deltas = []
            for w in range(WORKERS):
                late = yielding and w == 0
                if late and (yielding == "drop" or r == 0):
                    continue
                base = prev if late else p
                q = base.copy()
                for k in range(h):
                    step = r * h + k
                    g = self.model.grad(q, *self.batch(w, step))
                    if prox:  # FedProx: a pull back towards the round's global model limits drift
                        g += np.float32(prox) * (q - base)
                    q -= np.float32(self.lr_at(step)) * g
                deltas.append((q - base, outer.weight(1) if late else 1.0))
            prev = p
            p, mom = outer.step(p, mom, deltas)
        return self.val_loss(p)


def bytes_per_sample(count: int, h: int) -> float:
    """Each worker sends one blob (gradient or delta) and receives one (model) per exchange;
    an exchange covers ``h`` local steps of BATCH samples on every worker."""
    blob = len(wire.encode_vector("delta", np.zeros(count, np.float32), worker="w", round=0, base_sha256="0" * 64))
    return 2 * blob * WORKERS / (WORKERS * BATCH * h)


# -- (a) the digits sanity line ---------------------------------------------------------------
def digits(rounds: int = 30, h: int = 20) -> tuple[float, float]:
    x, y = data.load_digits()
    (xt, yt), shards = data.split(x, y, WORKERS)
    xt = xt.astype(np.float32) / 16
    shards = [(a.astype(np.float32) / 16, b.astype(np.int64)) for a, b in shards]
    m = MLP()
    p = m.init(0)
    for step in range(rounds * h):
        g = sum(
            m.grad(p, a[i], b[i])[1]
            for a, b in shards
            for i in [np.random.default_rng([step, len(b)]).integers(0, len(b), BATCH)]
        )
        p -= np.float32(0.1) * g / WORKERS
    sync_acc = m.accuracy(p, xt, yt.astype(np.int64))
    outer = Outer()
    q, mom = m.init(0), np.zeros(m.count, np.float32)
    for r in range(rounds):
        ds = []
        for i, (a, b) in enumerate(shards):
            loc, _, _ = train_local(m, q, a, b, steps=h, lr=0.1, batch=BATCH, seed=i, round_no=r)
            ds.append((loc - q, 1.0))
        q, mom = outer.step(q, mom, ds)
    return sync_acc, m.accuracy(q, xt, yt.astype(np.int64))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000, help="synchronous steps of 128 (default 3000)")
    ap.add_argument("--lr", type=float, default=0.5, help="inner / synchronous SGD peak learning rate")
    ap.add_argument("--only", default="", help="comma list of lines to run: sync,h1,h50,h500,h500m,drop,late")
    args = ap.parse_args()
    t0 = time.monotonic()
    sync_acc, local_acc = digits()
    print(f"(a) digits MLP, test accuracy: synchronous {100 * sync_acc:.1f} %   Local-SGD H=20 {100 * local_acc:.1f} %")
    lm = Lm(args.steps, args.lr)
    count = lm.model.count
    print(f"(b) char-LM: {count} parameters, {args.steps} × 128 samples per line, "
          f"{sum(len(s) for s in lm.shards)} training chars in {WORKERS} contiguous shards")  # fmt: skip
    only = set(filter(None, args.only.split(",")))
    lines: list[tuple[str, float, float]] = []

    def line(name: str, key: str, fn, h: int) -> None:  # type: ignore[no-untyped-def]
        if only and key not in only:
            return
        t = time.monotonic()
        loss = fn()
        lines.append((name, loss, bytes_per_sample(count, h)))
        base = lines[0][1] if lines and lines[0][0].startswith("synchronous") else None
        rel = f"{100 * (loss / base - 1):+.1f} %" if base else ""
        ratio = f"{lines[0][2] / bytes_per_sample(count, h):.0f}× fewer bytes/sample" if base and h > 1 else ""
        print(f"    {name:<44} val loss {loss:.3f} {rel:>8}  {bytes_per_sample(count, h):>10.1f} B/sample "
              f"{ratio}  ({time.monotonic() - t:.0f} s)", flush=True)  # fmt: skip

    outer = Outer()
    line("synchronous data-parallel SGD", "sync", lm.sync, 1)
    for h in (1, 50, 500):
        line(f"Local-SGD H={h} (outer Nesterov 0.7/0.9)", f"h{h}", lambda h=h: lm.local(h, outer), h)
    # Six outer steps only at H=500: momentum 0.9 never settles; 0.5 measured best of {0.9, 0.5, FedAvg}.
    soft = Outer(momentum=0.5)
    line("Local-SGD H=500 (outer Nesterov 0.7/0.5)", "h500m", lambda: lm.local(500, soft), 500)
    print("(c) one of four workers yielding every round, H=50:")
    line("  its delta dropped (prototype rule)", "drop", lambda: lm.local(50, outer, "drop"), 50)
    line(f"  applied a round late, weight {outer.weight(1):g}", "late", lambda: lm.local(50, outer, "late"), 50)
    print(f"total {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
