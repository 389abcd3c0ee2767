"""The worker: register -> pull model + shard -> train H local steps -> push the delta.

It runs as an ERAN-GRID job: SIGSTOP freezes it between any two instructions (harmless: the
round it was in is pushed late, and the coordinator takes it with its staleness weight or
refuses it with a reason); SIGTERM asks it to save a checkpoint into
``$ERAN_GRID_CHECKPOINT_DIR`` and exit 75, and the next attempt resumes the round from it
when that round is still open, or drops it when it is not (never pushes a half-trained or
mixed-up delta). It writes nothing but that checkpoint directory, stdout and stderr, and
opens no device: its only peer is the NATS server.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from . import PROTOCOL, inner, protocol, wire
from .errors import (
    EX_TEMPFAIL,
    BadBlob,
    CoordinatorUnreachable,
    IntegrityError,
    RegistrationRefused,
    UserError,
)
from .inner import InnerOpt
from .model import MLP, hash_worker, train_local
from .store import TIMEOUTS, TRANSPORT_ERRORS, Creds, Outage, Store, dump_row, parse_row, write_atomic

T = TypeVar("T")
Log = Callable[[str], None]


class Vacated(Exception):
    """SIGTERM arrived: the checkpoint is saved, the process exits 75."""


@dataclass
class Options:
    worker: str
    rounds: int = 0  # 0: until the coordinator says training has finished
    timeout: float = 5.0  # one NATS call
    outage_window: float = 60.0  # how long NATS may be away (calls retried) before the job fails closed
    register_for: float = 10.0  # how long to wait for a coordinator to answer the registration
    idle_timeout: float = 300.0  # no new round for this long: the coordinator is gone
    poll: float = 0.05
    checkpoint_dir: Path | None = None
    creds: Creds | None = None  # the worker's user on the NATS server; its name is the worker id


def capabilities() -> dict[str, Any]:
    """How this worker computes. Nothing about who owns it, where it is or what is around it."""
    return {
        "cpus": min(os.cpu_count() or 1, 4096),
        "python": platform.python_version(),
        "numpy": np.__version__[:32],
        "arch": platform.machine()[:32],
        "protocol": PROTOCOL,
    }


class Checkpoint:
    """``meta.json`` + ``params.bin`` in the job's checkpoint directory, each written to a
    temp name and renamed (ERAN-GRID skips names ending in .tmp when it packs the directory)."""

    def __init__(self, directory: Path | None) -> None:
        self.dir = directory

    def save(self, meta: dict[str, Any], params: np.ndarray) -> None:
        if self.dir is None:
            return
        for name, payload in (("params.bin", wire.encode_vector("model", params)), ("meta.json", dump_row(meta))):
            write_atomic(self.dir / name, payload)

    def load(self, count: int) -> tuple[dict[str, Any], np.ndarray] | None:
        """The saved round, or None (none, or unusable: a checkpoint is never trusted blindly)."""
        if self.dir is None:
            return None
        try:
            meta = parse_row((self.dir / "meta.json").read_bytes())
            params, _ = wire.decode_vector((self.dir / "params.bin").read_bytes(), "model", count)
        except (OSError, BadBlob):
            return None
        if meta is None or not isinstance(meta.get("step"), int) or not isinstance(meta.get("round"), int):
            return None
        return meta, params

    def clear(self) -> None:
        if self.dir is None:
            return
        for name in ("meta.json", "params.bin"):
            (self.dir / name).unlink(missing_ok=True)


class Worker:
    def __init__(self, url: str, opts: Options, log: Log) -> None:
        self.opts = opts
        self.log = log
        self.store = Store(
            url, timeout=opts.timeout, name=f"eran-cloud {opts.worker}", creds=opts.creds, identity=opts.worker
        )
        self.outage = Outage(self.store, opts.outage_window, log)
        self.ckpt = Checkpoint(opts.checkpoint_dir)
        self.term = False
        self.shard: tuple[np.ndarray, np.ndarray] | None = None
        self.pushed: list[dict[str, Any]] = []
        self.resumed: list[dict[str, int]] = []  # rounds continued from a checkpoint, and at which step

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A NATS call retried while the server is away (nats-py reconnects); after
        ``outage_window`` seconds of failures the job fails closed (exit 4)."""
        while True:
            try:
                result = await asyncio.wait_for(call(), timeout=self.opts.timeout)
                self.outage.over()
                return result
            except TRANSPORT_ERRORS as exc:
                await self.outage.failed(exc, f" ({what})")

    async def register(self) -> dict[str, Any]:
        w = self.opts.worker
        req = dump_row({"v": PROTOCOL, "worker": w, "capabilities": capabilities()})
        deadline = time.monotonic() + self.opts.register_for
        while True:
            try:
                msg = await self.store.nc.request(protocol.register_subject(w), req, timeout=self.opts.timeout)
                self.outage.over()
                break
            except TRANSPORT_ERRORS as exc:
                # NATS is away, or a coordinator is there but slower than one call (a loaded
                # machine): an outage, not a missing coordinator (that is "no responders").
                if not self.store.connected or isinstance(exc, TIMEOUTS):
                    await self.outage.failed(exc, " (register)")
                    deadline = time.monotonic() + self.opts.register_for
                    continue
                if time.monotonic() >= deadline:  # no responders: the coordinator is not running
                    raise CoordinatorUnreachable(
                        f"no coordinator answered the registration on {self.store.url} within "
                        f"{self.opts.register_for:g} s ({self.store.cause(exc)})",
                        hint="start it: eran-cloud coordinator --nats URL",
                    ) from exc
                await asyncio.sleep(0.5)
        reply = parse_row(msg.data)
        if reply is None or reply.get("v") != PROTOCOL:
            raise RegistrationRefused("the coordinator's reply is not protocol version 1")
        if not reply.get("accepted"):
            raise RegistrationRefused(f"registration refused: {str(reply.get('reason', ''))[:300]}")
        self.log(f"registered as {w}; shard {reply.get('shard')}")
        return reply

    async def pull_shard(self, reply: dict[str, Any], train: dict[str, Any]) -> None:
        name, sha = str(reply.get("shard", "")), str(reply.get("shard_sha256", ""))
        blob = await self.retrying("pull shard", lambda: self.store.get_blob(name))
        if blob is None or wire.sha256(blob) != sha:
            raise IntegrityError(f"shard {name!r} does not match the sha256 the coordinator announced")
        try:
            x, y, _ = wire.decode_shard(blob, int(train["inputs"]), int(train["classes"]))
        except BadBlob as exc:
            raise IntegrityError(f"shard {name!r}: {exc}") from exc
        self.shard = (x, y)

    async def state(self) -> dict[str, Any]:
        row, _ = await self.retrying("read the round state", lambda: self.store.get_json("state"))
        if row is None or row.get("v") != PROTOCOL:
            raise IntegrityError("the coordinator's round state is missing or not protocol version 1")
        bad = protocol.check_state(row)
        if bad:
            raise IntegrityError(f"the coordinator's round state is unusable: {bad}")
        return row

    async def pull_model(self, st: dict[str, Any], model: MLP) -> np.ndarray | None:
        """The round's model, verified; None when the round moved on while we read it."""
        r, sha = int(st["round"]), str(st["model_sha256"])
        limit = wire.vector_max_bytes(model.count)
        try:
            blob = await self.retrying("pull the model", lambda: self.store.get_blob(protocol.model_key(r), limit))
        except BadBlob as exc:
            raise IntegrityError(f"model of round {r}: {exc}") from exc
        if blob is not None and wire.sha256(blob) == sha:
            try:
                params, _ = wire.decode_vector(blob, "model", model.count)
                return params
            except BadBlob as exc:
                raise IntegrityError(f"model of round {r}: {exc}") from exc
        now = await self.state()
        if int(now["round"]) != r:
            return None
        raise IntegrityError(f"model of round {r} does not match its published sha256 {sha[:12]}: refusing to train")

    async def push(self, r: int, base_sha: str, delta: np.ndarray, steps: int) -> str:
        assert self.shard is not None
        w = self.opts.worker
        blob = wire.encode_vector("delta", delta, worker=w, round=r, base_sha256=base_sha)
        sha = wire.sha256(blob)
        name = protocol.delta_object(r, w, sha)
        inbox = protocol.inbox_bucket(w)
        await self.retrying("push the delta", lambda: self.store.put_blob(name, blob, bucket=inbox))
        record = protocol.push_record(w, r, base_sha, name, sha, len(self.shard[1]), steps)
        created = await self.retrying(
            "push the record", lambda: self.store.create_json(protocol.push_key(r, w), record)
        )
        if not created:
            self.log(f"round {r}: a push for this round exists already: this one is not sent (no double count)")
            return "duplicate"
        self.pushed.append({"round": r, "sha256": sha})
        return "pushed"

    async def verdict(self, r: int, wait: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            row, _ = await self.retrying(
                "read the verdict", lambda: self.store.get_json(protocol.verdict_key(r, self.opts.worker))
            )
            if row is not None:
                return row
            await asyncio.sleep(self.opts.poll)
        return None

    async def connect(self) -> None:
        """A server that takes longer than ``timeout`` to answer (a loaded machine) is an
        outage ridden out for ``outage_window``; nothing listening, a refusal or no buckets
        fail at once."""
        while True:
            try:
                await self.store.connect(create=False)
                self.outage.over()
                return
            except CoordinatorUnreachable as exc:
                cause, last = exc.__cause__, self.store.last_error
                if not isinstance(cause, TIMEOUTS) or not (last is None or isinstance(last, TIMEOUTS)):
                    raise
                await self.outage.failed(cause, " (connect)")

    async def run(self) -> dict[str, Any]:
        await self.connect()
        try:
            return await self._run()
        finally:
            await self.store.close()

    async def _run(self) -> dict[str, Any]:
        reply = await self.register()
        st = await self.state()
        train = st["train"]
        model = MLP(inputs=int(train["inputs"]), hidden=int(train["hidden"]), classes=int(train["classes"]))
        opt = InnerOpt(inner.from_train(train)[0])  # its state is kept across rounds (DiLoCo), in this process only
        await self.pull_shard(reply, train)
        assert self.shard is not None
        x, y = self.shard
        done = 0
        resume = self.ckpt.load(model.count)
        last_change = time.monotonic()
        seen_round = -1
        while True:
            st = await self.state()
            r = int(st["round"])
            if r != seen_round:
                seen_round, last_change = r, time.monotonic()
            if st.get("phase") == "finished":
                self.log(f"training finished at round {r}")
                break
            if self.opts.rounds and done >= self.opts.rounds:
                break
            ours = protocol.push_key(r, self.opts.worker)
            pushed, _ = await self.retrying("read our push", functools.partial(self.store.get_json, ours))
            if pushed is not None:  # ours already (a previous attempt): wait for the next round
                if time.monotonic() - last_change > self.opts.idle_timeout:
                    raise CoordinatorUnreachable(
                        f"no new round for {self.opts.idle_timeout:g} s: the coordinator is gone"
                    )
                await self._sleep()
                continue
            base = await self.pull_model(st, model)
            if base is None:
                continue
            start, params = 0, base
            if resume is not None:
                meta, saved = resume
                resume = None
                if (
                    meta.get("worker") == self.opts.worker
                    and meta["round"] == r
                    and meta.get("base_sha256") == st["model_sha256"]
                ):
                    start, params = int(meta["step"]), saved
                    self.resumed.append({"round": r, "step": start})
                    self.log(f"round {r}: resuming at local step {start} from the checkpoint")
                else:
                    self.log(f"checkpoint of round {meta['round']} is stale (now round {r}): dropped, never pushed")
                done = int(meta.get("rounds_done", done)) if meta.get("worker") == self.opts.worker else done
            h = int(train["h"])
            _, schedule = inner.from_train(st["train"])  # each round: a restarted coordinator may run longer
            self.log(f"round {r}: training local steps {start}..{h}")
            local, step, loss = train_local(
                model, params, x, y, steps=h, lr=float(train["lr"]), batch=int(train["batch"]),
                seed=int(train["seed"]) * 1000 + hash_worker(self.opts.worker), round_no=r, start=start,
                stop=lambda: self.term, opt=opt, schedule=schedule,
            )  # fmt: skip
            if step < h:  # vacated mid-round: keep the work for the next attempt
                self.ckpt.save(
                    {"v": PROTOCOL, "worker": self.opts.worker, "round": r, "base_sha256": st["model_sha256"],
                     "step": step, "rounds_done": done},
                    local,
                )  # fmt: skip
                raise Vacated(f"vacated in round {r} at local step {step}/{h}: checkpoint saved")
            outcome = await self.push(r, st["model_sha256"], local - base, h)
            self.ckpt.clear()
            verdict = await self.verdict(r, wait=2.0) if outcome == "pushed" else None
            if verdict is None:
                note = "verdict pending" if outcome == "pushed" else outcome
            else:
                note = "accepted" if verdict.get("accepted") else f"rejected: {verdict.get('reason', '')}"
            self.log(f"round {r}: {h} local steps, loss {loss:.3f}, delta pushed ({note})")
            done += 1
            if self.term:
                raise Vacated(f"vacated after round {r} (pushed)")
        return {
            "worker": self.opts.worker,
            "rounds": done,
            "pushed": self.pushed,
            "resumed": self.resumed,
            "mode": "live",
        }

    async def _sleep(self) -> None:
        await asyncio.sleep(self.opts.poll)
        if self.term:
            raise Vacated("vacated while waiting for the next round")


def default_worker_id(env: dict[str, str]) -> str:
    """Under ERAN-GRID the job's id (stable across its requeues, so a resumed job keeps its
    shard); elsewhere the user names the worker. Never anything read from the machine."""
    job = env.get("ERAN_GRID_JOB_ID", "")
    if job and protocol.WORKER_ID.match(f"job-{job}"):
        return f"job-{job}"
    raise UserError("no worker id", hint="give one: eran-cloud client --nats URL --worker-id ID")


def run_live(url: str, opts: Options, log: Log) -> tuple[int, dict[str, Any] | None]:
    worker = Worker(url, opts, log)

    def on_term(signum: int, frame: Any) -> None:
        worker.term = True

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        result = asyncio.run(worker.run())
        return 0, result
    except Vacated as exc:
        log(str(exc))
        return EX_TEMPFAIL, None
    finally:
        signal.signal(signal.SIGTERM, old)


def print_result(result: dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=True), flush=True)
