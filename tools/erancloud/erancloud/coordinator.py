"""The coordinator: the global model, the round and the registry, all kept in JetStream.

Round state machine (one ``state`` row, updated compare-and-set):

    open(r) --[accepted >= quorum and (deadline passed or every expected worker pushed
               or the grace after the quorum passed)]-->
        commit: model.{r+1}, momentum.{r+1}, round.{r} written, then state -> open(r+1)

The quorum: ``max(min_deltas, ceil(quorum_share x eligible workers))`` (``Coordinator.quorum``).
The grace: once the quorum is in, the round waits as long again as the quorum
took to gather (at least ``--min-grace``, default 0.5 s), then closes without the stragglers: a worker
that registers and never pushes cannot hold every round to its deadline.
    open(r) --[deadline passed, accepted < quorum]--> open(r), deadline extended (BOINC: wait)
    open(r) --[r == rounds]--> finished

Invariants (tested under injected faults):
* a delta is applied at most once per (worker, round): deltas are folded only in the commit,
  which is one compare-and-set on ``state``; the (worker, round) pairs it applied are written
  into that same row, and a replayed or re-written push of an applied pair is never used again;
* a push is judged once: its verdict row is created, never overwritten, and names the
  accepted delta's object and sha256; a later revision of a judged push key is ignored, and a
  verdict read back after a restart restores that delta, never the push row's current text;
* a delta whose values were accepted before (from any worker, within ``content_rounds``
  rounds) is refused: ``content.<sha256 of the values>`` rows, created once per accepted
  delta, pruned through the ``contents.<r>`` index of the round that applied it;
* the coordinator acts for a worker only with the worker's own rights: registrations are
  answered over a second connection that may publish to inboxes alone (auth.py), and only on
  the requester's own inbox (``protocol.reply_subject_ok``); requests are rate-limited per
  worker (excess dropped and counted in ``rejected``);
* the global model is never corrupted: every delta is checked (hash, size, finite, norm) before
  it is accepted, and ``model.{r}`` is named in ``state`` only after it has been written;
* a restart loses nothing: the pushes of the open round are replayed from the KV bucket;
* no row read back from the store is trusted: ``state`` must pass
  ``protocol.check_coordinator_state`` (else exit 5 with the reason), a registry row that fails
  ``protocol.check_worker_row`` is reported and ignored;
* a colluding minority cannot steer the model: with the default ``reference`` aggregate each
  delta is weighted by its agreement with the coordinator's own update on a root set it holds
  (outer.py; the root set is never reported on), copies of accepted deltas are refused, and a
  worker down-weighted (or trimmed) ``suspect_after`` rounds running is "suspect": its later
  pushes are refused;
* deadlines run on the monotonic clock: a wall-clock step never stalls or rushes a round.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import PROTOCOL, data, inner, protocol, status, wire
from .errors import BadBlob, CloudError, IntegrityError
from .inner import InnerOpt
from .model import MLP, hash_worker, train_local
from .outer import Outer
from .store import TIMEOUTS, TRANSPORT_ERRORS, Creds, Disconnected, Outage, Store, dump_row, parse_row

Log = Callable[[str], None]
# Verdict rows are written for pushes of rounds up to this far ahead of the open one: a worker
# pushing for round after round must not make the coordinator fill its own bucket with verdicts
# it never prunes. Further out: counted, logged, the push row deleted. (Past rounds are bounded
# by the rounds run so far.)
VERDICTS_AHEAD = 8
MIN_GRACE = 0.5  # seconds a round waits after its quorum, at least (see the module docstring)
# A round closes on at least this share of the eligible workers' deltas (and never fewer than
# --min-deltas): the first workers to arrive cannot close the first rounds among themselves.
QUORUM_SHARE = 0.5
# The duplicate-delta guard (content.<sha256 of the values> rows) holds for this many rounds
# after a delta was applied: ten times as long as the coordinator publishes accepted deltas
# (keep_rounds), at ~200 bytes a row: 64 workers x 500 rounds ~ 6 MB of the 64 MiB bucket.
CONTENT_ROUNDS = 500
# Registrations a worker may send: a burst, then one per REGISTER_EVERY seconds. A worker
# registers once per job; a flood of them took the coordinator's lock and wrote its row each time.
REGISTER_BURST = 5
REGISTER_EVERY = 2.0
RATE_TABLE_MAX = 4096  # workers tracked by the rate limiter (the oldest entries go first)
# The coordinator's root set: the first rows of its held-out split (the rest is what test
# accuracy is reported on). 150 rows measured best of 100/150 (bench/bench_erancloud.py (a)).
ROOT_ROWS = 150
ROOT_SEED = "coordinator-root"  # the root run's batch order, as a worker's comes from its id


def values_sha256(delta: np.ndarray) -> str:
    """The sha256 of a delta's float32 values (little-endian): its content, whoever sends it."""
    return hashlib.sha256(np.ascontiguousarray(delta, dtype="<f4").tobytes()).hexdigest()


class RateLimit:
    """A token bucket per worker on the monotonic clock."""

    def __init__(self, burst: int = REGISTER_BURST, every: float = REGISTER_EVERY) -> None:
        self.burst, self.every = burst, every
        self.tokens: dict[str, tuple[float, float]] = {}

    def allow(self, worker: str, now: float) -> bool:
        tokens, then = self.tokens.pop(worker, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - then) / self.every)
        ok = tokens >= 1.0
        self.tokens[worker] = (tokens - 1.0 if ok else tokens, now)
        while len(self.tokens) > RATE_TABLE_MAX:
            del self.tokens[next(iter(self.tokens))]
        return ok


@dataclass
class Config:
    rounds: int = 30
    min_deltas: int = 3
    round_timeout: float = 30.0
    shards: int = 4
    h_steps: int = 20
    lr: float = 0.1
    inner: str = "sgd"  # inner.py: sgd | nesterov | adamw
    warmup: int = 0  # inner steps of linear lr warmup (global steps: round x H + local step)
    schedule: str = "constant"  # or "cosine" to 0 at the last round's last step
    batch: int = 32
    hidden: int = 32
    seed: int = 0
    outer: Outer = field(default_factory=Outer)
    live_window: int = 3
    max_workers: int = 64
    max_delta_norm: float = 100.0
    keep_rounds: int = 50
    content_rounds: int = CONTENT_ROUNDS  # rounds a content.<sha256> row is kept after its delta was applied
    expire_rounds: int = 10  # a registration with no delta applied for this many rounds expires
    suspect_after: int = 3  # trimmed rounds running that flag a worker "suspect"
    outage_window: float = 60.0  # NATS unreachable for longer than this: exit 4
    min_grace: float = MIN_GRACE  # seconds a round waits after its quorum, at least
    quorum_share: float = QUORUM_SHARE  # of the eligible workers (Coordinator.quorum)
    poll: float = 0.05
    status_path: Path = Path("status.json")
    dry_run_dir: Path | None = None


class Coordinator:
    def __init__(self, cfg: Config, store: Store, log: Log) -> None:
        self.cfg = cfg
        self.store = store
        self.log = log
        self.lock = asyncio.Lock()
        self.state: dict[str, Any] = {}
        self.revision = 0
        self.model = MLP(hidden=cfg.hidden)
        self.params = np.zeros(0, np.float32)
        self.momentum = np.zeros(0, np.float32)
        self.test: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 64)), np.zeros(0))
        self.root: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 64)), np.zeros(0))
        self.references: dict[int, tuple[np.ndarray, str]] = {}  # round -> (own update, blob sha256)
        self.registry: dict[str, dict[str, Any]] = {}
        self.accepted: dict[tuple[str, int], tuple[np.ndarray, float, str]] = {}  # (worker, round) -> delta
        self.commits = 0
        self.deadline = 0.0  # time.monotonic() of the open round's deadline
        self.opened = time.monotonic()  # when the open round opened (or this coordinator took it)
        self.quorum_at: float | None = None  # when the open round reached min_deltas
        self.limits = RateLimit()
        self.unconfirmed: list[dict[str, Any] | None] = []  # state writes whose outcome is unknown
        self.missed: set[str] = set()  # workers the open round expected that let a deadline pass

    # -- start ----------------------------------------------------------------------------
    async def load_or_init(self) -> None:
        x, y = data.load_digits()
        row, rev = await self.store.get_json("state")
        if row is None and rev == 0:
            await self._init(x, y)
            row, rev = await self.store.get_json("state")
        bad = protocol.check_coordinator_state(row)
        if bad:
            raise IntegrityError(
                f"the round state in the store is unusable ({bad}): refusing to resume from it",
                hint="only this coordinator writes it (docs/erancloud.md, authenticated roles): restore the "
                "JetStream directory from a backup, or start over on a fresh one",
            )
        assert row is not None
        self.state, self.revision = row, rev
        self.model = MLP(hidden=int(row["train"]["hidden"]))
        (xt, yt), shards = data.split(x, y, int(row["shards_n"]), seed=int(row["train"]["seed"]))
        digests = [wire.sha256(wire.encode_shard(a, b, 10, shard=i)) for i, (a, b) in enumerate(shards)]
        if digests != row["shards"]:
            raise IntegrityError(
                "the digits data here splits differently from the shards this coordinator published",
                hint="run the coordinator with the same scikit-learn data, or start over on a fresh NATS store",
            )
        pixels, labels = xt.astype(np.float32) / 16.0, yt.astype(np.int64)
        self.root = (pixels[:ROOT_ROWS], labels[:ROOT_ROWS])
        self.test = (pixels[ROOT_ROWS:], labels[ROOT_ROWS:])
        r = int(row["round"])
        self.params = await self._load_vector(protocol.model_key(r), "model", row["model_sha256"])
        self.momentum = await self._load_vector(protocol.momentum_key(r), "momentum", row["momentum_sha256"])
        # The latest coordinator's flags win for these (the rest is fixed when training starts).
        row.update(rounds=self.cfg.rounds, min_deltas=self.cfg.min_deltas, round_timeout=self.cfg.round_timeout,
                   quorum_share=self.cfg.quorum_share)  # fmt: skip
        if "total_steps" in row["train"]:
            # The schedule ends with the run: a cosine to the old last round would train the
            # added rounds at lr 0, every worker's delta all zeros, refused as a duplicate.
            row["train"]["total_steps"] = self.cfg.rounds * int(row["train"]["h"])
        row.setdefault("outliers", {})
        row["suspect_after"] = self.cfg.suspect_after
        # The deadline continues on the monotonic clock, never longer than one round timeout.
        remaining = min(max(float(row["deadline"]) - time.time(), 0.0), float(row["round_timeout"]))
        self.deadline = time.monotonic() + remaining
        for key in await self.store.keys("worker."):
            worker_row, _ = await self.store.get_json(key)
            bad = protocol.check_worker_row(key, worker_row, int(row["shards_n"]))
            if bad:
                self._count("bad registry row")
                self.log(f"ignored registry row {key[:80]!r}: {bad}")
                continue
            assert worker_row is not None
            self.registry[key.removeprefix("worker.")] = worker_row
        self.log(
            f"round {r} ({row['phase']}): {len(self.registry)} registered workers; "
            f"outer {row['outer']['kind']} lr {row['outer']['lr']} momentum {row['outer']['momentum']}, "
            f"aggregate {row['outer'].get('aggregate', 'mean')}"
        )

    async def _init(self, x: np.ndarray, y: np.ndarray) -> None:
        cfg = self.cfg
        _, shards = data.split(x, y, cfg.shards, seed=cfg.seed)
        digests = []
        for i, (a, b) in enumerate(shards):
            blob = wire.encode_shard(a, b, 10, shard=i)
            await self.store.put_blob(protocol.shard_key(i), blob)
            digests.append(wire.sha256(blob))
        model = MLP(hidden=cfg.hidden)
        params = model.init(cfg.seed)
        model_blob = wire.encode_vector("model", params, round=0)
        mom_blob = wire.encode_vector("momentum", np.zeros_like(params), round=0)
        await self.store.put_blob(protocol.model_key(0), model_blob)
        await self.store.put_blob(protocol.momentum_key(0), mom_blob)
        now = time.time()
        row = {
            "v": PROTOCOL,
            "phase": "open",
            "round": 0,
            "rounds": cfg.rounds,
            "min_deltas": cfg.min_deltas,
            "quorum_share": cfg.quorum_share,
            "round_timeout": cfg.round_timeout,
            "opened": now,
            "deadline": now + cfg.round_timeout,
            "model_sha256": wire.sha256(model_blob),
            "momentum_sha256": wire.sha256(mom_blob),
            "model_history": {},
            "train": {
                "h": cfg.h_steps,
                "lr": cfg.lr,
                "inner": cfg.inner,
                "warmup": cfg.warmup,
                "schedule": cfg.schedule,
                "total_steps": cfg.rounds * cfg.h_steps,
                "batch": cfg.batch,
                "hidden": cfg.hidden,
                "seed": cfg.seed,
                "inputs": 64,
                "classes": 10,
            },
            "outer": cfg.outer.to_json(),
            "shards_n": cfg.shards,
            "shards": digests,
            "live_window": cfg.live_window,
            "last_push": {},
            "applied": {},
            "accuracy": [],
            "rejected": {},
        }
        if await self.store.create_json("state", row):
            self.log(f"new training: {cfg.shards} non-IID digits shards, model {model.count} parameters")

    async def _load_vector(self, name: str, kind: str, sha: str) -> np.ndarray:
        blob = await self.store.get_blob(name)
        if blob is None or wire.sha256(blob) != sha:
            raise IntegrityError(f"{name} in the object store does not match the state's sha256 {sha[:12]}")
        vec, _ = wire.decode_vector(blob, kind, self.model.count)
        return vec

    # -- registration ---------------------------------------------------------------------
    async def on_register(self, msg: Any) -> None:
        worker = protocol.worker_from_subject(str(msg.subject))
        reply_to = str(msg.reply or "")
        if worker is None or not protocol.reply_subject_ok(reply_to, worker):
            # Not answered: a reply goes to the requester's own inbox or nowhere.
            self._count("bad reply subject")
            self.log(f"a registration of {str(worker)[:64]} asked for its reply on {reply_to[:80]!r}: not answered")
            return
        if not self.limits.allow(worker, time.monotonic()):
            self._count("rate limited")
            return
        try:
            async with self.lock:
                reply = await self._register(worker, parse_row(msg.data))
            await msg.respond(dump_row(reply))
        except TRANSPORT_ERRORS as exc:  # NATS is away: the worker asks again
            self.log(f"registration of {str(worker)[:64]} not answered: {exc.__class__.__name__}")

    async def _register(self, worker: str | None, req: dict[str, Any] | None) -> dict[str, Any]:
        checked = protocol.check_registration(worker, req)
        if isinstance(checked, str):
            self.log(f"registration refused: {checked}")
            return {"v": PROTOCOL, "accepted": False, "reason": checked}
        worker, caps = checked
        if self.state["phase"] == "finished":
            return {"v": PROTOCOL, "accepted": False, "reason": "training has finished"}
        row = self.registry.get(worker)
        if row is None:
            # Only unexpired registrations are in the registry (rows expire in _expire).
            if len(self.registry) >= self.cfg.max_workers:
                reason = (
                    f"the registry is full ({self.cfg.max_workers} live workers; a registration expires "
                    f"after {self.cfg.expire_rounds} rounds without a delta)"
                )
                self.log(f"registration of {worker} refused: {reason}")
                return {"v": PROTOCOL, "accepted": False, "reason": reason}
            used = [int(r["shard"]) for r in self.registry.values()]
            n_shards = int(self.state["shards_n"])
            shard = min(range(n_shards), key=lambda s: (used.count(s), s))  # the least-used shard
            row = {
                "v": PROTOCOL,
                "worker": worker,
                "shard": shard,
                "registered_round": int(self.state["round"]),
                "registered": time.time(),
            }
            self.log(f"registered {worker} (shard {row['shard']})")
        await self.store.inbox(worker, create=True)
        row["capabilities"] = caps
        row["seen_round"] = int(self.state["round"])
        await self.store.put_json(f"worker.{worker}", row)
        self.registry[worker] = row
        n = int(row["shard"])
        return {
            "v": PROTOCOL,
            "accepted": True,
            "reason": "",
            "shard": protocol.shard_key(n),
            "shard_sha256": self.state["shards"][n],
        }

    # -- pushes ---------------------------------------------------------------------------
    async def on_push(self, key: str, value: bytes, revision: int) -> None:
        parsed = protocol.parse_push_key(key)
        if parsed is None:
            self._count("bad key")
            self.log(f"ignored a push under a malformed key {key[:80]!r}")
            return
        round_no, worker = parsed
        async with self.lock:
            current = int(self.state["round"])
            if round_no > current + VERDICTS_AHEAD:
                self._count("future round")
                self.log(f"round {current}: dropped a push of {worker} for round {round_no}: future round, no verdict")
                await self.store.delete(key)
                return
            record = parse_row(value)
            applied = self.state["applied"].get(f"{round_no}.{worker}")
            taken = self.accepted.get((worker, round_no))
            first = applied if applied is not None else taken[2] if taken is not None else None
            if first is not None:  # folded in, or accepted: a replay, or a rewrite of a judged push
                if record is None or record.get("sha256") != first:
                    self._count("rewritten push")
                return
            if await self._judged_before(round_no, worker, revision):
                return  # judged: its verdict stands, whatever the push row says now
            reason, weight, delta, sha = await self._judge(round_no, worker, record)
            if reason:
                self._count(reason.split(":")[0])
                self.log(f"round {self.state['round']}: rejected push of {worker} for round {round_no}: {reason}")
                await self._verdict(round_no, worker, False, reason, 0.0, revision, "")
                return
            assert delta is not None
            self.accepted[(worker, round_no)] = (delta, weight, sha)
            await self._verdict(round_no, worker, True, "", weight, revision, sha)

    async def _judged_before(self, round_no: int, worker: str, revision: int) -> bool:
        """True for a push this coordinator (or its previous run) has judged already. An
        accepted one not yet applied is taken into the open round again, from the delta its
        verdict names (copied where only the coordinator writes), never from the push row: a
        worker may rewrite its row after reading the others' deltas."""
        verdict, _ = await self.store.get_json(protocol.verdict_key(round_no, worker))
        if verdict is None:
            return False
        if verdict.get("push_revision") != revision:
            self._count("rewritten push")
            self.log(f"round {self.state['round']}: {worker}'s push for round {round_no} was rewritten after "
                     "its verdict: the first one stands")  # fmt: skip
        open_round = int(self.state["round"])
        if verdict.get("accepted") is True and verdict.get("in_round") == open_round:
            sha = verdict.get("sha256")
            blob = None
            if isinstance(sha, str) and protocol.HEX64.match(sha):
                with contextlib.suppress(BadBlob):
                    blob = await self.store.get_blob(
                        protocol.delta_object(round_no, worker, sha), wire.vector_max_bytes(self.model.count)
                    )
            if blob is None or wire.sha256(blob) != sha:
                self.log(f"round {open_round}: the accepted delta of {worker} (round {round_no}) is gone: not used")
                return True
            delta, _ = wire.decode_vector(blob, "delta", self.model.count)
            self.accepted[(worker, round_no)] = (delta, float(verdict.get("weight", 0.0)), sha)
            self._note_quorum()
        return True

    async def _judge(
        self, round_no: int, worker: str, record: dict[str, Any] | None
    ) -> tuple[str, float, np.ndarray | None, str]:
        reason, weight, delta, blob = await self._check(round_no, worker, record)
        if reason or delta is None or record is None:
            return reason, weight, None, ""
        values = values_sha256(delta)
        first = {"v": PROTOCOL, "worker": worker, "round": round_no}
        if not await self.store.create_json(protocol.content_key(values), first):
            seen, _ = await self.store.get_json(protocol.content_key(values))
            owner = (seen.get("worker"), seen.get("round")) if seen else None
            if owner != (worker, round_no):  # ours: this very push, accepted before a crash
                who = f"{owner[0]}'s delta of round {owner[1]}" if owner else "a delta accepted before"
                return f"duplicate delta: the same values as {who[:120]}", 0.0, None, ""
        # The accepted blob is copied where only the coordinator writes: the round record's
        # replay never depends on an object its worker could delete.
        blob_name = protocol.delta_object(round_no, worker, record["sha256"])
        await self.store.put_blob(blob_name, blob)
        await self.store.delete_blob(record["object"], bucket=protocol.inbox_bucket(worker))
        return "", weight, delta, record["sha256"]

    async def _check(
        self, round_no: int, worker: str, record: dict[str, Any] | None
    ) -> tuple[str, float, np.ndarray | None, bytes]:
        """Why the push is refused ("" when it is not), its staleness weight, the delta and its blob."""
        current = int(self.state["round"])
        if worker not in self.registry:
            return "unknown worker: not registered", 0.0, None, b""
        if worker in status.suspects(self.state):
            return "suspect: its deltas were left out too many rounds running", 0.0, None, b""
        if self.state["phase"] == "finished":
            return "late: training has finished", 0.0, None, b""
        if round_no > current:
            return f"future round: round {round_no} is not open (current round {current})", 0.0, None, b""
        outer = Outer.from_json(self.state["outer"])
        weight = outer.weight(current - round_no)
        if weight <= 0:
            return f"stale: round {round_no} is closed (current round {current})", 0.0, None, b""
        bad = protocol.check_push(record, round_no, worker)
        if bad:
            return f"malformed push: {bad}", 0.0, None, b""
        assert record is not None
        base = self.state["model_sha256"] if round_no == current else self.state["model_history"].get(str(round_no))
        if record["base_sha256"] != base:
            return (
                f"model hash mismatch: the delta was computed on {record['base_sha256'][:12]}, "
                f"round {round_no}'s model is {str(base)[:12]}",
                0.0,
                None,
                b"",
            )
        try:
            limit = wire.vector_max_bytes(self.model.count)
            blob = await self.store.get_blob(record["object"], limit, bucket=protocol.inbox_bucket(worker))
            if blob is None:  # accepted before a restart: moved into our own bucket already
                blob = await self.store.get_blob(record["object"], limit)
        except BadBlob as exc:
            return f"corrupt delta: {exc}", 0.0, None, b""
        if blob is None:
            return "corrupt delta: the delta object is missing", 0.0, None, b""
        if wire.sha256(blob) != record["sha256"]:
            return "corrupt delta: sha256 does not match the push record", 0.0, None, b""
        try:
            delta, header = wire.decode_vector(blob, "delta", self.model.count)
        except BadBlob as exc:
            return f"corrupt delta: {exc}", 0.0, None, b""
        if header.get("worker") != worker or header.get("round") != round_no:
            return "corrupt delta: its header names another worker or round", 0.0, None, b""
        norm = float(np.linalg.norm(delta))
        if norm > self.cfg.max_delta_norm:
            return f"corrupt delta: norm {norm:.3g} is over the limit {self.cfg.max_delta_norm:g}", 0.0, None, b""
        copy = self._copy_of(worker, delta)
        if copy:
            return f"duplicate delta: {copy}", 0.0, None, b""
        return "", weight, delta, blob

    def _copy_of(self, worker: str, delta: np.ndarray) -> str:
        """Why ``delta`` is another worker's accepted delta re-sent (same values, or cosine above
        0.999: two honest workers on different shards never come that close), or ""."""
        n1 = float(np.linalg.norm(delta.astype(np.float64)))
        for (other, r), (d2, _, _) in sorted(self.accepted.items()):
            if other == worker:
                continue
            if np.array_equal(delta, d2):
                return f"the same values as {other}'s delta of round {r}"
            n2 = float(np.linalg.norm(d2.astype(np.float64)))
            if n1 > 0 and n2 > 0:
                cos = float(np.dot(delta.astype(np.float64), d2.astype(np.float64))) / (n1 * n2)
                if cos > 0.999:
                    return f"cosine {cos:.5f} with {other}'s delta of round {r}"
        return ""

    async def _verdict(
        self, round_no: int, worker: str, ok: bool, reason: str, weight: float, revision: int, sha: str
    ) -> None:
        row = {
            "v": PROTOCOL,
            "accepted": ok,
            "reason": reason,
            "weight": weight,
            "in_round": self.state["round"],
            "push_revision": revision,
            "sha256": sha,
        }
        if not await self.store.create_json(protocol.verdict_key(round_no, worker), row):
            self.log(f"round {self.state['round']}: a verdict on {worker}'s push for round {round_no} exists: kept")
        if ok:
            self._note_quorum()

    def _note_quorum(self) -> None:
        if self.quorum_at is None and len(self.accepted) >= self.quorum():
            self.quorum_at = time.monotonic()

    def _count(self, why: str) -> None:
        rej = self.state.setdefault("rejected", {})
        rej[why] = int(rej.get(why, 0)) + 1

    # -- rounds ---------------------------------------------------------------------------
    def expected_workers(self, state: dict[str, Any] | None = None) -> set[str]:
        """Workers the round waits for before its deadline: live ones and recent registrations."""
        state = self.state if state is None else state
        r, window = int(state["round"]), int(state["live_window"])
        live = set(status.live_workers(state))
        recent = {w for w, row in self.registry.items() if int(row.get("seen_round", -1)) >= r - window}
        return (live | recent) - set(status.suspects(state))  # a suspect's pushes are refused anyway

    def quorum(self, state: dict[str, Any] | None = None) -> int:
        """The deltas the open round needs: ``max(min_deltas, ceil(share x eligible))``, eligible
        being the expected workers (registered or delta applied within the live window, not
        suspect) that have not let this round's deadline pass: a worker that vanished stops
        counting after one round timeout, so it cannot hold training for ever."""
        state = self.state if state is None else state
        eligible = len(self.expected_workers(state) - self.missed)
        share = float(state.get("quorum_share", self.cfg.quorum_share))
        return max(int(state["min_deltas"]), math.ceil(share * eligible - 1e-9))

    async def tick(self) -> None:
        async with self.lock:
            if self.state["phase"] != "open":
                return
            now = time.monotonic()
            r = int(self.state["round"])
            fresh = {w for (w, rr) in self.accepted if rr == r}
            quorum = self.quorum()
            enough = len(self.accepted) >= quorum
            if enough and self.quorum_at is None:
                self.quorum_at = now  # reached by the eligible set shrinking, not by a new delta
            if enough and (now >= self.deadline or fresh >= self.expected_workers() or self._grace_over(now)):
                await self._commit()
            elif now >= self.deadline:
                self.missed |= self.expected_workers() - fresh
                timeout = float(self.state["round_timeout"])
                state = {**self.state, "deadline": time.time() + timeout}
                await self._save_state(state)
                self.deadline = now + timeout
                self.log(
                    f"round {r}: {len(self.accepted)} of {quorum} deltas (quorum) at the deadline; "
                    "waiting another round timeout"
                )

    def _grace_over(self, now: float) -> bool:
        if self.quorum_at is None:
            return False
        return now >= self.quorum_at + max(self.cfg.min_grace, self.quorum_at - self.opened)

    async def _save_state(self, state: dict[str, Any] | None = None) -> None:
        """Compare-and-set ``state`` (default: the current one). Only once the store holds it
        does it become this coordinator's state: a failed write changes nothing here.

        A write whose reply was lost (an outage) may still have landed: every such write is
        remembered until one succeeds, and a compare-and-set that fails against a row equal to
        one of them is our own write, not a second coordinator's: its revision is taken and
        the current state written over it. (Before: the retried commit carried new times, did
        not equal the row that had landed, and the coordinator exited "is a second one
        running?" with only one running.)"""
        state = self.state if state is None else state
        state["registered"] = len(self.registry)
        state["quorum"] = self.quorum(state)
        for _ in range(2):
            written = parse_row(dump_row(state))
            self.unconfirmed = [*self.unconfirmed[-15:], written]
            rev = await self.store.update_json("state", state, self.revision)
            if rev:
                break
            row, now_rev = await self.store.get_json("state")
            if row == written:
                rev = now_rev
                break
            if row not in self.unconfirmed:
                raise CloudError(
                    "the round state changed under this coordinator: is a second one running?",
                    hint="run exactly one coordinator per NATS store",
                )
            self.revision = now_rev  # our own earlier write: write the current state over it
        else:
            raise CloudError("the round state could not be written twice in a row", hint="is a second one running?")
        self.unconfirmed.clear()
        self.state, self.revision = state, rev

    async def _commit(self) -> None:
        r = int(self.state["round"])
        outer = Outer.from_json(self.state["outer"])
        items = sorted(self.accepted.items())
        reference, references, reference_row = None, None, None
        ref_shas: list[str | None] = [None] * len(items)
        if outer.aggregate == "reference":
            reference, ref_sha = await self._reference(r)
            reference_row = {"object": protocol.reference_key(r), "sha256": ref_sha}
            judged_by = [await self._reference(rr) for (_, rr), _ in items]
            references = [vec for vec, _ in judged_by]
            ref_shas = [sha for _, sha in judged_by]
        deltas = [(d, w) for _, (d, w, _) in items]
        new_p, new_m, judged = outer.step_judged(self.params, self.momentum, deltas, reference, references)
        accuracy = self.model.accuracy(new_p, *self.test)
        model_blob = wire.encode_vector("model", new_p, round=r + 1)
        mom_blob = wire.encode_vector("momentum", new_m, round=r + 1)
        await self.store.put_blob(protocol.model_key(r + 1), model_blob)
        await self.store.put_blob(protocol.momentum_key(r + 1), mom_blob)
        applied = [
            {"worker": w, "round": rr, "object": protocol.delta_object(rr, w, sha), "sha256": sha, "weight": wt,
             "norm": round(j.norm, 6), "trust": round(j.trust, 6), "cosine": round(j.cosine, 6),
             "opposed": j.opposed, "verdict": j.verdict, "reference_sha256": ref}
            for ((w, rr), (_, wt, sha)), j, ref in zip(items, judged, ref_shas, strict=True)
        ]  # fmt: skip
        await self.store.put_json(
            protocol.round_key(r),
            {
                "v": PROTOCOL,
                "round": r,
                "base_sha256": self.state["model_sha256"],
                "base_momentum_sha256": self.state["momentum_sha256"],
                "applied": applied,
                "aggregate": outer.aggregate,
                "reference": reference_row,
                "model_sha256": wire.sha256(model_blob),
                "momentum_sha256": wire.sha256(mom_blob),
                "test_accuracy": accuracy,
            },
        )
        # The index of this round's content rows, so they can be pruned without a scan.
        contents = {"v": PROTOCOL, "round": r, "content": sorted({values_sha256(d) for _, (d, _, _) in items})}
        await self.store.put_json(protocol.contents_key(r), contents)
        st = json.loads(dump_row(self.state))  # a copy: self.state changes only once this is stored
        keep_from = r + 1 - outer.max_staleness - 1
        st["applied"] = {k: v for k, v in st["applied"].items() if int(k.split(".")[0]) >= keep_from}
        st["applied"].update({f"{a['round']}.{a['worker']}": a["sha256"] for a in applied})
        st["model_history"] = {k: v for k, v in st["model_history"].items() if int(k) >= keep_from}
        st["model_history"][str(r)] = st["model_sha256"]
        outliers = self._track_outliers(st, applied, r)
        st["accuracy"] = [*st["accuracy"], [r, accuracy, len(applied)]][-100:]
        st.update(
            round=r + 1,
            model_sha256=wire.sha256(model_blob),
            momentum_sha256=wire.sha256(mom_blob),
            opened=time.time(),
            deadline=time.time() + float(st["round_timeout"]),
        )
        if r + 1 >= int(st["rounds"]):
            st["phase"] = "finished"
        expired = self._expired(st)
        for w in expired:
            self.registry.pop(w, None)
            outliers.pop(w, None)
        # Expected workers whose delta did not make this round: shown by status.
        pushed = {a["worker"] for a in applied}
        st["silent"] = sorted(w for w in self.expected_workers() if w not in pushed and w not in expired)[:64]
        self.missed = set()  # a new round: every expected worker counts again
        await self._save_state(st)
        self.deadline = time.monotonic() + float(st["round_timeout"])
        self.opened, self.quorum_at = time.monotonic(), None
        self.params, self.momentum = new_p, new_m
        self.accepted = {k: v for k, v in self.accepted.items() if k[1] > r}  # none: pushes for r+1 wait
        self.commits += 1
        names = ", ".join(f"{a['worker']}@{a['round']}" for a in applied)
        self.log(f"round {r} closed: {len(applied)} deltas ({names}); test accuracy {100 * accuracy:.1f} %")
        for w in expired:
            await self.store.delete(f"worker.{w}")
            self.log(f"registration of {w} expired: no delta applied for {self.cfg.expire_rounds} rounds")
        await self._prune(r + 1)
        self.write_status()

    def _track_outliers(self, st: dict[str, Any], applied: list[dict[str, Any]], r: int) -> dict[str, Any]:
        """Each applied delta's worker: its last push, and its outlier row (kept while its deltas
        are clipped or trimmed, dropped once one is applied as sent). The rows, in ``st``."""
        outliers: dict[str, Any] = st.setdefault("outliers", {})
        for a in applied:
            st["last_push"][a["worker"]] = r
            if a["verdict"] == "applied":
                outliers.pop(a["worker"], None)
                continue
            # Only opposed rounds (trimmed, or pointing against the coordinator's own update) count
            # towards "suspect": an honest worker the model drifted away from is clipped for a
            # while, and one near convergence sends noise: neither must be branded for it.
            before = outliers.get(a["worker"], {})
            streak = int(before.get("streak", 0)) + 1 if isinstance(before, dict) else 1
            streak = streak if a["opposed"] else 0
            outliers[a["worker"]] = {"verdict": a["verdict"], "norm": a["norm"], "round": r, "streak": streak}
            self.log(f"round {r}: the delta of {a['worker']} was {a['verdict']} (norm {a['norm']:.3g}, "
                     f"{streak} round(s) running)")  # fmt: skip
        return outliers

    async def _reference(self, round_no: int) -> tuple[np.ndarray, str]:
        """The coordinator's own update for round ``round_no`` (the workers' local steps from
        that round's model, on its root set) and the sha256 of its blob ``reference.<r>``:
        computed once (deterministic: the same model and batches give the same update), stored
        for the replay, kept while a late delta may still be judged against it."""
        if round_no in self.references:
            return self.references[round_no]
        if round_no == int(self.state["round"]):
            params = self.params
        else:
            sha = self.state["model_history"].get(str(round_no))
            params = await self._load_vector(protocol.model_key(round_no), "model", str(sha))
        train = self.state["train"]
        kind, schedule = inner.from_train(train)
        local, _, _ = train_local(
            self.model, params, *self.root, steps=int(train["h"]), lr=float(train["lr"]),
            batch=int(train["batch"]), seed=int(train["seed"]) * 1000 + hash_worker(ROOT_SEED), round_no=round_no,
            opt=InnerOpt(kind), schedule=schedule,  # a fresh state: the same model gives the same update
        )  # fmt: skip
        update = local - params
        blob = wire.encode_vector("delta", update, worker="coordinator", round=round_no)
        await self.store.put_blob(protocol.reference_key(round_no), blob)
        oldest = round_no - Outer.from_json(self.state["outer"]).max_staleness
        self.references = {k: v for k, v in self.references.items() if k >= oldest}
        self.references[round_no] = (update, wire.sha256(blob))
        return self.references[round_no]

    def _expired(self, st: dict[str, Any]) -> list[str]:
        """Registrations with neither a registration nor an applied delta in the last
        ``expire_rounds`` rounds: a vanished (or fake) worker stops holding a registry place."""
        now = int(st["round"])
        return sorted(
            w for w, row in self.registry.items()
            if max(int(row["seen_round"]), int(st["last_push"].get(w, -1))) < now - self.cfg.expire_rounds
        )  # fmt: skip

    async def _prune(self, now: int) -> None:
        """Drop what is older than ``keep_rounds`` (and the duplicate-delta guard's rows older
        than ``content_rounds``): JetStream is a store, not an archive."""
        gone = now - 1 - self.cfg.content_rounds  # the round whose content rows now expire
        if gone >= 0:
            index, _ = await self.store.get_json(protocol.contents_key(gone))
            shas = index.get("content") if index is not None else None
            for sha in shas if isinstance(shas, list) else []:
                if isinstance(sha, str) and protocol.HEX64.match(sha):
                    await self.store.delete(protocol.content_key(sha), no_marker=True)
            await self.store.delete(protocol.contents_key(gone), no_marker=True)
        old = now - self.cfg.keep_rounds
        if old < 0:
            return
        for name in (protocol.model_key(old), protocol.momentum_key(old), protocol.reference_key(old)):
            await self.store.delete_blob(name)
        for key in (protocol.round_key(old), *[k for k in await self.store.keys(f"push.{old}.")]):
            await self.store.delete(key)
        for key in await self.store.keys(f"verdict.{old}."):
            await self.store.delete(key)
        for name in await self.store.blob_names():
            if name.startswith(f"delta.{old}."):
                await self.store.delete_blob(name)

    def write_status(self) -> None:
        state = {**self.state, "quorum": self.quorum()} if self.state.get("phase") == "open" else self.state
        fig = status.figures(state, len(self.registry), status.count_dry_runs(self.cfg.dry_run_dir))
        status.write_atomic(self.cfg.status_path, fig)


async def run(
    url: str,
    cfg: Config,
    log: Log,
    timeout: float = 5.0,
    creds: Creds | None = None,
    reply_creds: Creds | None = None,
) -> dict[str, Any]:
    store = Store(url, timeout=timeout, name="eran-cloud coordinator", creds=creds)
    # Registrations are received and answered on a connection of their own: with the shipped
    # server config its user may publish to inboxes and nothing else (auth.py).
    replies = Store(url, timeout=timeout, name="eran-cloud coordinator replies", creds=reply_creds)
    await store.connect(create=True)
    coord = Coordinator(cfg, store, log)
    try:
        await replies.connect(buckets=False)
        await coord.load_or_init()
        await coord._save_state()  # take the round state: a second coordinator would now fail its CAS
        sub = await replies.nc.subscribe(f"{protocol.REGISTER_PREFIX}.*", cb=coord.on_register)
        # The status file says "serving": written once the server holds the subscription (a
        # flush is a round trip behind the SUB), so a worker started after it never meets "no
        # responders" from a coordinator that is there but had not subscribed yet.
        await replies.nc.flush(timeout=max(1, round(timeout)))
        coord.write_status()
        watcher: Any = None
        outage = Outage(store, cfg.outage_window, log)
        last_status = time.monotonic()
        while coord.state["phase"] == "open":
            try:
                if not store.connected:
                    raise Disconnected("disconnected")
                if watcher is None or store.reconnected:
                    # After an outage the server may have lost the watcher's consumer: a new one
                    # replays every push, and on_push knows the ones judged already.
                    store.reconnected = False
                    if watcher is not None:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(watcher.stop(), timeout)
                    watcher = None
                    watcher = await store.pushes.watch("push.>")
                with contextlib.suppress(*TIMEOUTS):
                    entry = await watcher.updates(timeout=cfg.poll)
                    while entry is not None:
                        if entry.value and entry.operation is None:
                            await coord.on_push(entry.key, entry.value, int(entry.revision or 0))
                        entry = await watcher.updates(timeout=0.001)
                await coord.tick()
                outage.over()
            except TRANSPORT_ERRORS as exc:
                await outage.failed(exc)
                watcher = None
            if time.monotonic() - last_status > 2:
                coord.write_status()
                last_status = time.monotonic()
        with contextlib.suppress(*TRANSPORT_ERRORS):
            await sub.unsubscribe()
            if watcher is not None:
                await watcher.stop()
        coord.write_status()
        return status.figures(coord.state, len(coord.registry), status.count_dry_runs(cfg.dry_run_dir))
    except TRANSPORT_ERRORS as exc:
        raise store.unreachable(exc) from exc
    finally:
        await replies.close()
        await store.close()
