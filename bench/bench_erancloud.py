"""ERANCLOUD: Local-SGD (outer Nesterov over pseudo-gradients, DiLoCo) against a FAIR
synchronous data-parallel baseline, side by side in one run, at an equal number of samples.

    nice -n 10 .venv/bin/python bench/bench_erancloud.py [--steps 2000[,8000,...]] [--inner nesterov|adamw]
        [--seeds 0,1,2] [--only sync,h50,h500,late,byz] [--jobs 2]

Fairness (what the first version of this benchmark got wrong: plain SGD at an untuned lr for
the baseline, Nesterov only on the Local-SGD side, settings picked on the split reported):

* three splits of every shard's text: train (first 95 %), tuning (next 2.5 %), report (last
  2.5 %). Every learning rate is chosen on the tuning split, every figure is on the report split;
* the same inner optimizer on both sides (``--inner``, the product's erancloud.inner): SGD
  with Nesterov momentum 0.9, or AdamW (DiLoCo's: betas 0.9/0.95, weight decay 0.1); the synchronous
  baseline applies it to the gradient averaged over the four workers (same total batch, 128);
  a Local-SGD worker keeps its own optimizer state across rounds;
* equal tuning budgets: every line picks its settings among the same number of
  configurations (15), on the tuning split, all printed: the same lr grid (8 points, factor 2
  apart, 0.003125 to 0.4 for Nesterov: wide enough to bracket every line's optimum, flagged if
  it does not) for the baseline and for each Local-SGD H, the same schedule (linear warmup over
  the first 5 % of the steps, then cosine to 0); then three more each at the best lr: the
  baseline three warmups (x 1/2, x 2, x 4), each Local-SGD H three outer (lr, momentum)
  settings around DiLoCo's 0.7/0.9 (0.5/0.9, 1/0.7, 1/0.5); then four more each: the lr
  again at the setting chosen, x 1/sqrt 2 and x sqrt 2, then x 2 and x 2 sqrt 2 (or their
  inverses) on the better side;
* every Local-SGD run has whole rounds only: with the default 2,000 steps, H = 500 has four
  outer rounds, H = 50 forty. ``--steps 2000,8000`` prints one table per horizon, each line
  tuned again at that horizon with the same budget (the best lr and outer step move with it),
  every gap against the baseline of the same horizon (DiLoCo, Douillard et al. 2023, runs
  H = 500 over tens of thousands of steps: four rounds are not the regime it is meant for);
* every reported figure is the mean over ``--seeds`` (>= 3) with min and max; samples and
  characters seen are printed per line, the loss gap with the perplexity ratio exp(loss gap).

Lines: (a) digits, 12 rounds: the Byzantine rows (a sign-flip x99 first in line, -mean at the
clip, a zero delta, 2 of 5 and 3 of 7 colluding), each beside its all-honest and
attacker-absent references, with the default 'reference' aggregate and Flower's anchors;
(b) char-LM: synchronous, H = 50, H = 500, one of four workers yielding every round (H = 50,
its delta a round late, weight 0.75), one Byzantine worker of four (H = 50, sign-flip scaled
to the norm limit) with the trimmed aggregation; then the targets, met or not.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing as mp
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
from erancloud.inner import InnerOpt, Schedule, local_steps  # noqa: E402
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
        # Summing the context positions' gradients into the embedding rows: bincount per
        # column is the same sum as np.add.at, several times faster.
        flat, dxf = ctx.ravel(), dx.reshape(-1, self.d)
        gemb = np.stack([np.bincount(flat, dxf[:, j], self.v) for j in range(self.d)], axis=1)
        parts = [gemb, x.T @ dh, dh.sum(0), hid.T @ dz, dz.sum(0)]
        return np.concatenate([q.ravel() for q in parts]).astype(np.float32)


def load_text() -> tuple[list[np.ndarray], np.ndarray, np.ndarray, int]:
    """(4 contiguous training shards, tuning text and report text from every shard's end,
    vocabulary size)."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    chars = sorted(set(text))
    codes = np.array([chars.index(c) for c in chars], np.int64)  # noqa: F841 - documents the mapping
    table = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((table[c] for c in text), np.int64, len(text))
    shards, tune, report = [], [], []
    for part in np.array_split(ids, WORKERS):
        cut, cut2 = int(len(part) * 0.95), int(len(part) * 0.975)
        shards.append(part[:cut])
        tune.append(part[cut:cut2])
        report.append(part[cut2:])
    return shards, np.concatenate(tune), np.concatenate(report), len(chars)


def windows(text: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ctx = text[idx[:, None] + np.arange(CONTEXT)[None, :]]
    return ctx, text[idx + CONTEXT]


class Lm:
    """Both sides of (b) run the product's inner optimizer and schedule (erancloud.inner) and
    Local-SGD the product's outer step (erancloud.outer): what is measured is what ships."""

    def __init__(self, steps: int, inner: str, warmup: float) -> None:
        self.shards, tune, report, vocab = load_text()
        self.model = CharMLP(vocab)
        self.steps, self.inner = steps, inner
        self.warmup = int(steps * warmup)
        rng = np.random.default_rng(99)
        self.split = {
            "tune": windows(tune, rng.integers(0, len(tune) - CONTEXT - 1, 10_000)),
            "report": windows(report, rng.integers(0, len(report) - CONTEXT - 1, 10_000)),
        }

    def schedule(self, lr: float, warmup: int | None = None) -> Schedule:
        """Linear warmup, then cosine decay to 0 at the run's last step (DiLoCo's schedule)."""
        return Schedule(lr, self.warmup if warmup is None else warmup, "cosine", self.steps)

    def batch(self, seed: int, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        text = self.shards[worker]
        idx = np.random.default_rng([seed, worker, step]).integers(0, len(text) - CONTEXT - 1, BATCH)
        return windows(text, idx)

    def loss(self, p: np.ndarray, split: str) -> float:
        return self.model.loss(p, *self.split[split])

    def sync(self, lr: float, seed: int, split: str, warmup: int | None = None) -> float:
        p = self.model.init(seed)

        def grad(q: np.ndarray, step: int) -> np.ndarray:
            # The four workers' batches as one batch of 128: its gradient is the mean of theirs.
            parts = [self.batch(seed, w, step) for w in range(WORKERS)]
            ctx, nxt = np.concatenate([c for c, _ in parts]), np.concatenate([n for _, n in parts])
            return self.model.grad(q, ctx, nxt)

        local_steps(p, grad, InnerOpt(self.inner), self.schedule(lr, warmup).at, 0, self.steps)
        return self.loss(p, split)

    def local(self, lr: float, seed: int, split: str, h: int, outer: Outer, late: str = "",
              byzantine: bool = False) -> float:  # fmt: skip
        """Local-SGD. ``late``: "" (all on time) or "late" (worker 0's delta a round late);
        ``byzantine``: worker 3 sends its delta sign-flipped and scaled to norm 99."""
        p = self.model.init(seed)
        mom = np.zeros_like(p)
        prev = p.copy()
        opts = [InnerOpt(self.inner) for _ in range(WORKERS)]  # each worker's state kept across rounds
        sched = self.schedule(lr)
        for r in range(self.steps // h):
            deltas = []
            for w in range(WORKERS):
                is_late = late == "late" and w == 0
                if is_late and r == 0:
                    continue
                base = prev if is_late else p
                q = base.copy()

                def grad(x: np.ndarray, step: int, w: int = w) -> np.ndarray:
                    return self.model.grad(x, *self.batch(seed, w, step))

                local_steps(q, grad, opts[w], sched.at, r * h, (r + 1) * h)
                d = q - base
                if byzantine and w == 3:
                    d = -d * np.float32(99.0 / max(float(np.linalg.norm(d)), 1e-12))
                deltas.append((d, outer.weight(1) if is_late else 1.0))
            prev = p
            p, mom = outer.step(p, mom, deltas)
        return self.loss(p, split)


def bytes_per_sample(count: int, h: int) -> float:
    """Each worker sends one blob (gradient or delta) and receives one (model) per exchange;
    an exchange covers ``h`` local steps of BATCH samples on every worker."""
    blob = len(wire.encode_vector("delta", np.zeros(count, np.float32), worker="w", round=0, base_sha256="0" * 64))
    return 2 * blob * WORKERS / (WORKERS * BATCH * h)


# -- (a) the digits lines ---------------------------------------------------------------------
def krum(xs: np.ndarray, f: int) -> np.ndarray:
    """Krum (Blanchard et al. 2017, as Flower ships it): the delta closest to its n - f - 2
    nearest neighbours."""
    n = len(xs)
    k = max(1, n - f - 2)
    dist = ((xs[:, None, :] - xs[None, :, :]) ** 2).sum(-1)
    scores = [np.sort(np.delete(dist[i], i))[:k].sum() for i in range(n)]
    return xs[int(np.argmin(scores))]


def digits(
    aggregate: str, attack: str = "", workers: int = WORKERS, attackers: int = 0, seed: int = 0, rounds: int = 12
) -> tuple[float, list[bool]]:
    """The coordinator's own setting (non-IID shards, H = 20, lr 0.1, batch 32, outer Nesterov
    0.7/0.9, its root set and report split); the attackers are the last ``attackers`` workers,
    reading the honest deltas of the round before they push (they push last). Returns (test
    accuracy, per attacker: flagged suspect, i.e. opposed ``suspect_after`` = 3 rounds running).
    ``first``: the attacker's sign-flip x99 is one of the first three deltas of rounds 0-1 (a
    round closes at the quorum, --min-deltas 3)."""
    from erancloud.coordinator import ROOT_ROWS, ROOT_SEED
    from erancloud.model import hash_worker

    x, y = data.load_digits()
    (xt, yt), shards = data.split(x, y, workers)
    sh = [(a.astype(np.float32) / 16, b.astype(np.int64)) for a, b in shards]
    pixels, labels = xt.astype(np.float32) / 16, yt.astype(np.int64)
    root, test = (pixels[:ROOT_ROWS], labels[:ROOT_ROWS]), (pixels[ROOT_ROWS:], labels[ROOT_ROWS:])
    m = MLP()
    outer = Outer(aggregate=aggregate if aggregate != "krum" else "mean")
    q, mom = m.init(seed), np.zeros(m.count, np.float32)
    streaks, flagged = [0] * attackers, [False] * attackers
    for r in range(rounds):
        honest = []
        for i, (a, b) in enumerate(sh[: workers - attackers]):
            loc, _, _ = train_local(m, q, a, b, steps=20, lr=0.1, batch=BATCH,
                                    seed=seed * 1000 + hash_worker(f"w{i}"), round_no=r)  # fmt: skip
            honest.append(loc - q)
        mean = np.mean(honest, axis=0)
        median = float(np.median([np.linalg.norm(h) for h in honest]))
        if attack in ("flip", "first"):
            bad = [-honest[0] * np.float32(99.0 / float(np.linalg.norm(honest[0])))] * attackers
        elif attack == "negmean":
            bad = [-mean * np.float32(1.49 * median / float(np.linalg.norm(mean)))] * attackers
        elif attack == "zero":
            bad = [np.zeros_like(q)] * attackers
        else:
            bad = []
        deltas = bad[:1] + honest[:2] if attack == "first" and r < 2 else honest + bad
        loc, _, _ = train_local(m, q, *root, steps=20, lr=0.1, batch=BATCH,
                                seed=seed * 1000 + hash_worker(ROOT_SEED), round_no=r)  # fmt: skip
        ref = loc - q
        if aggregate == "krum":
            g = -krum(np.stack(deltas).astype(np.float64), attackers)
            mm = outer.momentum * mom.astype(np.float64) + g
            q, mom = (q - outer.lr * (g + outer.momentum * mm)).astype(np.float32), mm.astype(np.float32)
            continue
        q, mom, judged = outer.step_judged(q, mom, [(d, 1.0) for d in deltas], ref)
        if bad:
            mine = judged[:1] if attack == "first" and r < 2 else judged[len(honest):]
            for j, verdict in enumerate(mine):
                streaks[j] = streaks[j] + 1 if verdict.opposed else 0
                flagged[j] = flagged[j] or streaks[j] >= 3
    return m.accuracy(q, *test), flagged


BYZANTINE_ROWS = (  # (name, workers, attackers, attack)
    ("1 of 4 sign-flip x99, first in line", 4, 1, "first"),
    ("1 of 4 sign-flip x99", 4, 1, "flip"),
    ("1 of 4 -mean at the clip", 4, 1, "negmean"),
    ("1 of 4 zero delta", 4, 1, "zero"),
    ("2 of 5 colluding -mean at the clip", 5, 2, "negmean"),
    ("3 of 7 colluding -mean at the clip", 7, 3, "negmean"),
)
DIGITS_AGGREGATES = ("reference", "trimmed", "median", "krum")


def digits_table(seeds: list[int]) -> None:
    print(f"(a) digits MLP, 12 rounds, test accuracy (mean of seeds {seeds}); the default aggregate is "
          "'reference'; krum and median as Flower ships them (anchors), trimmed the previous default:")  # fmt: skip
    head = "".join(f"{a:>11}" for a in DIGITS_AGGREGATES)
    print(f"    {'row':<38}{'all honest':>11}{'absent':>9}{head}   suspect (reference)")
    met = True
    for name, n, f, attack in BYZANTINE_ROWS:
        def mean_of(agg: str, atk: str, workers: int, bad: int) -> float:
            return float(np.mean([digits(agg, atk, workers, bad, seed)[0] for seed in seeds]))

        honest = mean_of("reference", "", n, 0)
        absent = mean_of("reference", "", n - f, 0)
        accs = {a: mean_of(a, attack, n, f) for a in DIGITS_AGGREGATES}
        flags = [all(digits("reference", attack, n, f, seed)[1]) for seed in seeds]
        met = met and accs["reference"] >= 0.90 and all(flags)
        cells = "".join(f"{100 * accs[a]:>10.1f}%" for a in DIGITS_AGGREGATES)
        print(f"    {name:<38}{100 * honest:>10.1f}%{100 * absent:>8.1f}%{cells}   "
              f"{'every attacker' if all(flags) else f'{sum(flags)} of {len(flags)} seeds'}", flush=True)  # fmt: skip
    print(f"    target (every row >= 90 % with 'reference', every attacker suspect): {'met' if met else 'NOT met'}")


# Equal tuning budgets: every line chooses its settings among the same number of
# configurations (BUDGET), all on the tuning split with TUNE_SEED, every one printed.
# Stage 1, both sides: the inner lr grid (factor 2 apart), Local-SGD at DiLoCo's outer 0.7/0.9.
# Stage 2, three more each at its best lr: the baseline three warmups (x 1/2, x 2, x 4); each
# Local-SGD H three more outer (lr, momentum).
# Stage 3, four more each: the inner lr again, at the setting stage 2 chose (the best inner lr
# moves with the outer step: measured, H=50's from 0.025 at 0.7/0.9 to 0.05 at 1/0.7): x 1/sqrt 2
# and x sqrt 2, then x 2 and x 2 sqrt 2 (or their inverses) on the side that did better.
# The steady-state outer step is lr / (1 - momentum) times the mean delta: 7, 5, 3.3, 2 for
# these four; the first round's is lr (1 + momentum): 1.33, 0.95, 1.7, 1.5.
# The grid spans a factor 128 so that every line's optimum lies inside it (a line whose chosen
# lr has no lr tried above and below it at its setting is flagged "not bracketed").
GRIDS = {
    "nesterov": (0.003125, 0.00625, 0.0125, 0.025, 0.05, 0.1, 0.2, 0.4),
    "adamw": (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2),
}
# DiLoCo's 0.7/0.9 first, then around it: a smaller outer lr, and less momentum at lr 1.
OUTER_GRID = ((0.7, 0.9), (0.5, 0.9), (1.0, 0.7), (1.0, 0.5))
BUDGET = len(GRIDS["nesterov"]) + len(OUTER_GRID) - 1 + 4
WARMUP_FACTORS = (0.5, 2.0, 4.0)  # the baseline's stage 2
TUNE_SEED = 1000  # tuning runs use their own seed (init and batches), not a report seed
H_OF = {"sync": 1, "h50": 50, "h500": 500, "late": 50, "byz": 50}
NAMES = {
    "sync": "synchronous data-parallel (same optimizer)",
    "h50": "Local-SGD H=50",
    "h500": "Local-SGD H=500",
    "late": "H=50, 1 of 4 yielding every round (late, 0.75)",
    "byz": "H=50, 1 of 4 Byzantine, robust aggregation",
}
_LM: Lm | None = None  # set before the process pool forks: every run reads the same data
Task = tuple[str, float, tuple[float, float], str, int, float]  # line, inner lr, outer, split, seed, warmup


def _run(task: Task) -> float:
    """One training run -> its loss on the task's split."""
    key, lr, o, split, seed, warmup = task
    assert _LM is not None
    if key == "sync":
        return _LM.sync(lr, seed, split, int(_LM.steps * warmup))
    # The honest lines combine with the plain mean (a trusted setup, as DiLoCo); the
    # Byzantine line with the trimmed aggregation.
    outer = Outer(lr=o[0], momentum=o[1], aggregate="trimmed" if key == "byz" else "mean")
    late = "late" if key == "late" else ""
    return _LM.local(lr, seed, split, H_OF[key], outer, late=late, byzantine=key == "byz")


def _setting(t: Task) -> str:
    key, lr, o, _, _, warmup = t
    return f"lr {lr:.4g}" + (f" outer {o[0]:g}/{o[1]:g}" if key != "sync" else f" warmup {100 * warmup:g} %")


def lm_table(steps: int, args: argparse.Namespace, seeds: list[int], only: set[str]) -> None:
    """(b) at one horizon: every line tuned with the same budget, then reported, then the
    targets, each figure labelled with the horizon it is for."""
    global _LM
    _LM = lm = Lm(steps, args.inner, args.warmup)
    count = lm.model.count
    samples = steps * BATCH * WORKERS
    epochs = samples / sum(len(s) for s in lm.shards)
    print(f"(b) char-LM at {steps} steps: {count} parameters; inner {args.inner} (erancloud.inner), total batch "
          f"{BATCH * WORKERS}, {steps} steps (warmup {lm.warmup}, then cosine; H=500: {steps // 500} outer rounds, "
          f"H=50: {steps // 50}); {samples} samples = {samples * (CONTEXT + 1)} characters read per line "
          f"({epochs:.2f} passes over the training text); tuning split (seed {TUNE_SEED}), {BUDGET} configurations "
          f"per line; report split: seeds {seeds}", flush=True)  # fmt: skip
    wanted = [k for k in NAMES if not only or k in only]
    tuned_as = {k: ("h50" if k in ("late", "byz") else k) for k in wanted}  # whose settings a line uses
    to_tune = [k for k in ("sync", "h50", "h500") if k in tuned_as.values()]
    first, wf = OUTER_GRID[0], args.warmup
    done: dict[str, float] = {}
    if args.cache is not None and args.cache.exists():
        for line in args.cache.read_text().splitlines():
            row = json.loads(line)
            done[row["key"]] = float(row["loss"])

    def run_all(pool: concurrent.futures.Executor, tasks: list[Task]) -> list[float]:
        # The key holds every setting of a run: the horizon, the inner optimizer and the task.
        keys = {t: json.dumps([steps, args.inner, *t]) for t in tasks}
        futures = {pool.submit(_run, t): t for t in tasks if keys[t] not in done}
        for fut in concurrent.futures.as_completed(futures):
            key = keys[futures[fut]]
            done[key] = fut.result()
            if args.cache is not None:
                with args.cache.open("a") as f:
                    f.write(json.dumps({"key": key, "loss": done[key]}) + "\n")
        return [done[keys[t]] for t in tasks]

    tried: dict[str, dict[Task, float]] = {k: {} for k in to_tune}
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs), mp_context=mp.get_context("fork")) as pool:
        # 1. the inner lr of every line, at DiLoCo's outer setting for Local-SGD
        tasks = [(k, lr, first, "tune", TUNE_SEED, wf) for k in to_tune for lr in GRIDS[args.inner]]
        for t, v in zip(tasks, run_all(pool, tasks), strict=True):
            tried[t[0]][t] = v
        best = {k: min(tried[k], key=lambda t: tried[k][t]) for k in to_tune}
        # 2. three more configurations per line: its other setting, at its best lr
        tasks = []
        for k in to_tune:
            lr = best[k][1]
            if k == "sync":
                tasks += [(k, lr, first, "tune", TUNE_SEED, round(f * wf, 6)) for f in WARMUP_FACTORS]
            else:
                tasks += [(k, lr, o, "tune", TUNE_SEED, wf) for o in OUTER_GRID[1:]]
        for t, v in zip(tasks, run_all(pool, tasks), strict=True):
            tried[t[0]][t] = v
        # 3. four more: the lr again, at the other setting stage 2 chose: x 1/sqrt 2 and
        # x sqrt 2, then two steps further (x 2, x 2 sqrt 2 or inverses) on the side that did better
        top = {k: min(tried[k], key=lambda t: tried[k][t]) for k in to_tune}
        tasks = [(k, round(top[k][1] * f, 6), *top[k][2:]) for k in to_tune for f in (2**-0.5, 2**0.5)]
        for t, v in zip(tasks, run_all(pool, tasks), strict=True):
            tried[t[0]][t] = v
        for further in (2.0, 2**1.5):
            tasks = []
            for k in to_tune:
                down, up = ((k, round(top[k][1] * f, 6), *top[k][2:]) for f in (2**-0.5, 2**0.5))
                f = 1 / further if tried[k][down] < tried[k][up] else further
                while (t := (k, round(top[k][1] * f, 6), *top[k][2:])) in tried[k]:  # a grid point: step on
                    f *= 2**0.5 if f > 1 else 2**-0.5
                tasks.append(t)
            for t, v in zip(tasks, run_all(pool, tasks), strict=True):
                tried[t[0]][t] = v
        chosen = {}
        for k in to_tune:
            chosen[k] = min(tried[k], key=lambda t: tried[k][t])
            print(f"    tuning {NAMES[k][:20]:<20} ({len(tried[k])} configurations): "
                  + "  ".join(f"{_setting(t)}: {v:.3f}" for t, v in tried[k].items())
                  + f"  -> {_setting(chosen[k])}", flush=True)  # fmt: skip
            lrs = [t[1] for t in tried[k] if t[2:] == chosen[k][2:]]  # tried at the chosen setting
            if not min(lrs) < chosen[k][1] < max(lrs):
                print(f"    {NAMES[k]}: no lr tried above and below {chosen[k][1]:g} at this setting: not bracketed")
        # 4. every line on the report split, each seed, at the settings of the line it is tuned as
        tasks = [(k, *chosen[tuned_as[k]][1:3], "report", s, chosen[tuned_as[k]][5]) for k in wanted for s in seeds]
        got = dict(zip(tasks, run_all(pool, tasks), strict=True))
    results: dict[str, float] = {}
    print(f"    report split at {steps} steps, seeds {seeds} (loss: mean, min, max; gap and perplexity ratio against "
          f"the baseline at {steps} steps):")  # fmt: skip
    for key in wanted:
        h = H_OF[key]
        vals = [got[(key, *chosen[tuned_as[key]][1:3], "report", s, chosen[tuned_as[key]][5])] for s in seeds]
        results[key] = float(np.mean(vals))
        base = results.get("sync")
        rel = f"{100 * (results[key] / base - 1):+.1f} %  ppl x{np.exp(results[key] - base):.3f}" if base else ""
        bps = bytes_per_sample(count, h)
        ratio = f"{bytes_per_sample(count, 1) / bps:.0f}x fewer B/sample" if h > 1 else ""
        print(f"    {NAMES[key]:<48} {_setting(chosen[tuned_as[key]]):<26} loss {np.mean(vals):.3f} "
              f"(min {min(vals):.3f} max {max(vals):.3f}) {rel:>20}  {bps:>9.1f} B/sample {ratio}",
              flush=True)  # fmt: skip
    print(f"targets at {steps} steps (against the fair baseline at {steps} steps):")
    for key, limit, what in (("h50", 3, "H=50 within +3 %"), ("h500", 6, "H=500 within +6 % at >= 500x fewer bytes"),
                             ("late", 6, "one of four yielding every round within +6 %")):  # fmt: skip
        if key in results and "sync" in results:
            gap = 100 * (results[key] / results["sync"] - 1)
            ppl = float(np.exp(results[key] - results["sync"]))
            print(f"    {what}: {'met' if gap <= limit else 'NOT met'} ({gap:+.1f} % loss, perplexity x{ppl:.3f})")
    if "byz" in results and "h50" in results:
        gap = 100 * (results["byz"] / results["h50"] - 1)
        print(f"    one Byzantine worker of four within +3 % of the honest run: {'met' if gap <= 3 else 'NOT met'} "
              f"({gap:+.1f} %)")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="2000",
                    help="steps of 128 samples, or a comma list of horizons, each its own table "
                         "(default 2000: H=500 has 4 rounds)")  # fmt: skip
    ap.add_argument("--inner", choices=("nesterov", "adamw"), default="nesterov", help="inner optimizer, both sides")
    ap.add_argument("--warmup", type=float, default=0.05, help="linear warmup, fraction of the steps (default 0.05)")
    ap.add_argument("--seeds", default="0,1,2", help="report seeds (default 0,1,2)")
    ap.add_argument("--only", default="", help="comma list of lines: sync,h50,h500,late,byz")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (independent runs; default 2)")
    ap.add_argument("--no-digits", action="store_true", help="skip (a)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="JSON-lines file of finished runs (keyed by every setting): a run interrupted on a loaded "
                         "machine resumes where it stopped; each figure is still computed once")  # fmt: skip
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    only = set(filter(None, args.only.split(",")))
    horizons = [int(x) for x in args.steps.split(",")]
    if any(h < 500 or h % 500 for h in horizons):
        ap.error("every --steps must be a multiple of 500 (whole rounds for H=50 and H=500)")
    t0 = time.monotonic()
    if not args.no_digits:
        digits_table(seeds)
    for steps in horizons:
        lm_table(steps, args, seeds, only)
    print(f"total {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
