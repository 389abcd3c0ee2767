"""``alma update``: push a signed ``.swu`` to boards in waves, commit only what proves healthy.

Per board (each step one ``alma-ota`` call over the fleet's pinned ssh, docs/ota.md)::

    check -> lock -> push -> install -> reboot -> wait -> health -> commit
                                                    \\-> rollback (health failed / wrong slot)

Invariants (tested in tests/update):

- Nothing is committed that did not answer, on the new slot and after a fresh boot (a new
  boot id), with the pinned host key, a running guard and a health report that is OK or
  whose WARNINGs were all there before the update. The deadline for all of it is
  ``boot_timeout + health_timeout``; past it the board is rolled back (or, when it does not
  answer at all, recorded LOST: its bootloader falls back by itself after its retries).
- Every phase is written to the board's record before the next starts; a second run of the
  same ``.swu`` resumes from the record and the board's own state (``alma-ota status``).
- Ctrl-C stops every ssh call in flight (one shared deadline), records INTERRUPTED and
  leaves each board where it is: nothing committed by an interrupted run.
- Waves: ``canary`` boards first, then batches of ``batch``; after a wave with more than
  ``max_failures`` failed boards in total, the rest are SKIPPED.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import text as T

from alma import runner
from alma.errors import Interrupted, UserError
from alma.fleet.health import node_from_remote
from alma.fleet.inventory import Fleet, Node
from alma.fleet.severity import Severity
from alma.fleet.ssh import RemoteResult, close_master, run_connections, run_remote
from alma.ground import utc_now
from alma.update import records as R
from alma.update.swu import SwuInfo, version_tuple

AGENT = "alma-ota"
EXIT_OK = 0
EXIT_SOME_FAILED = 1  # some board rolled back, refused, failed or skipped; every board known-good
EXIT_LOST = 4  # some board did not come back: its state is unknown
SLOTS = ("a", "b")
MAX_TEXT = 300  # characters of one board-given string kept (records, reasons, the terminal)
MAX_DEPTH = 6  # the agent's answers are flat; deeper is hostile and dropped


def board_text(v: object, limit: int = MAX_TEXT) -> str:
    """Text a board (or its ssh) gave us, safe for a terminal and a record: escapes made
    visible (almaboard.text.terminal), clipped to ``limit`` characters."""
    t = T.terminal(v)
    return t if len(t) <= limit else t[: limit - 1] + "\u2026"


def _clean(v: Any, depth: int = 0) -> Any:
    """A board's JSON answer with every string made safe, containers bounded."""
    if isinstance(v, str):
        return board_text(v)
    if depth >= MAX_DEPTH:
        return None
    if isinstance(v, dict):
        return {board_text(k, 64): _clean(x, depth + 1) for k, x in list(v.items())[:64]}
    if isinstance(v, list):
        return [_clean(x, depth + 1) for x in v[:64]]
    return v if v is None or isinstance(v, (bool, int, float)) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


@dataclass
class Options:
    canary: int = 1
    batch: int = 1
    max_failures: int = 0
    boot_timeout: float = 300.0
    health_timeout: float = 120.0
    step_timeout: float = 120.0
    push_timeout: float = 1800.0
    poll_s: float = 2.0
    agent: str = AGENT
    allow_downgrade: bool = False  # an older .swu than a board runs: refused unless asked for


@dataclass
class Context:
    fleet: Fleet
    swu: Path
    info: SwuInfo
    opts: Options
    root: Path
    run: str
    cancel: runner.Deadline = field(default_factory=lambda: runner.Deadline(None, phase="alma update"))
    remote: Callable[..., RemoteResult] = run_remote
    on_event: Callable[[str, str], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    records_error: str | None = None  # set when a record could not be written: the run stops

    def event(self, node: str, text: str) -> None:
        if self.on_event is not None:
            with self.lock:
                self.on_event(node, text)


def run_id(info: SwuInfo) -> str:
    """Unique per desktop, user and run (two desktops with one hostname, or two users on one,
    must never share a board's lock); a resumed board keeps the id its record holds."""

    def safe(text: str, n: int) -> str:
        return "".join(c if c.isalnum() or c in "-." else "-" for c in text)[:n].strip("-.") or "x"

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{info.sha256[:12]}-{safe(socket.gethostname(), 20)}-{safe(user, 12)}-{secrets.token_hex(4)}"


def plan_waves(nodes: list[Node], canary: int, batch: int) -> list[list[Node]]:
    if canary < 0 or batch < 1:
        raise UserError("--canary must be >= 0 and --batch >= 1")
    waves = [nodes[:canary]] if canary else []
    rest = nodes[canary:]
    waves += [rest[i : i + batch] for i in range(0, len(rest), batch)]
    return [w for w in waves if w]


class _Stop(Exception):
    """End this board's run with a result (raised inside the flow)."""

    def __init__(self, result: str, reason: str) -> None:
        super().__init__(reason)
        self.result = result
        self.reason = reason


class RecordsUnwritable(UserError):
    """The desktop cannot write its records (a full or read-only disk): the run stops before
    it sends a board anything more; each board settles what it was given by itself. Exit 2."""


class _RecordsFull(Exception):
    pass


class _StepError(Exception):
    def __init__(self, reason: str, res: RemoteResult | None = None, code: int | None = None) -> None:
        reason = board_text(reason, 2 * MAX_TEXT)  # ssh's and the board's words: made safe here, once
        super().__init__(reason)
        self.reason = reason
        self.res = res
        self.code = code

    @property
    def unreachable(self) -> bool:
        return self.res is not None and self.res.error is not None


class BoardUpdate:
    def __init__(self, ctx: Context, node: Node, rec: R.UpdateRecord) -> None:
        self.ctx, self.node, self.rec = ctx, node, rec
        self.run_name = rec.run  # a resumed board keeps the run id that holds its lock
        self.log_path: Path | None = R.campaign_dir(ctx.root, ctx.info.sha256) / f"{node.name}.log"
        rec.log = self.log_path.name

    # ---- plumbing ---------------------------------------------------------------------------

    def _log(self, res: RemoteResult) -> None:
        if self.log_path is None:  # --dry-run: nothing written
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(f"$ {res.command}  [exit {res.returncode}, {res.duration_s:.2f} s, {res.error or 'ran'}]\n")
            for ln in res.lines[-200:]:
                f.write(f"  {board_text(ln, 2000)}\n")
            for ln in res.stderr[-50:]:
                f.write(f"  stderr: {board_text(ln, 2000)}\n")

    def _drop_dead_link(self, res: RemoteResult | None = None) -> None:
        """After a reboot, a lost link or a call cut short, the board's shared connection (if
        the run keeps one) is closed: a board that went away without closing its end would
        leave the next calls waiting on a dead link."""
        if res is None or res.error is not None:
            close_master(self.node, self.ctx.fleet.ssh)

    def _check_cancel(self) -> None:
        if self.ctx.cancel.expired():
            raise _Stop(R.INTERRUPTED, "interrupted (Ctrl-C): run the same command again to resume")

    def call(self, sub: str, *, timeout: float | None = None, stdin: int | None = None) -> dict[str, Any]:
        self._check_cancel()
        cmd = f"{self.ctx.opts.agent} {sub}"
        kw: dict[str, Any] = {}
        if stdin is not None:
            kw["run"] = functools.partial(runner.run, stdin=stdin)
        res = self.ctx.remote(
            self.node,
            cmd,
            self.ctx.fleet.ssh,
            timeout=timeout or self.ctx.opts.step_timeout,
            cancel=self.ctx.cancel,
            max_output=1 << 20,
            **kw,
        )
        self._log(res)
        self._drop_dead_link(res)
        self._check_cancel()
        doc: Any = None
        for ln in reversed(res.lines):
            if ln.startswith("{"):
                try:
                    doc = _clean(json.loads(ln))
                except (ValueError, RecursionError):
                    doc = None
                break
        if res.error is not None:
            raise _StepError(res.why(), res)
        if not isinstance(doc, dict):
            raise _StepError(f"{sub.split()[0]}: no JSON answer ({res.why()})", res, res.returncode)
        if res.returncode != 0 or "error" in doc:
            raise _StepError(str(doc.get("error", res.why())), res, res.returncode)
        return doc

    def phase(self, name: str) -> R.Phase:
        p = R.Phase(name, R.now())
        self.rec.phases.append(p)
        self.save()
        self.ctx.event(self.node.name, name)
        p._t0 = time.monotonic()
        return p

    def done(self, p: R.Phase, result: str = "ok", detail: str | None = None) -> None:
        p.finished = R.now()
        p.duration_s = round(time.monotonic() - getattr(p, "_t0", time.monotonic()), 3)
        p.result, p.detail = result, detail
        self.save()

    def save(self) -> None:
        with self.ctx.lock:
            try:
                R.save(self.ctx.root, self.rec)
            except OSError as exc:
                why = f"cannot write the update record in {self.ctx.root}: {exc.strerror or exc}"
                self.ctx.records_error = self.ctx.records_error or why
                raise _RecordsFull(why) from None

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        p = self.phase(name)
        try:
            out = fn()
        except _Stop as exc:
            self.done(p, "interrupted" if exc.result == R.INTERRUPTED else "failed", exc.reason)
            raise
        except _StepError as exc:
            self.done(p, "failed", exc.reason)
            raise
        self.done(p, "ok", out if isinstance(out, str) else None)
        return out

    # ---- the flow ---------------------------------------------------------------------------

    def run(self) -> R.UpdateRecord:
        try:
            try:
                self._flow()
            except _Stop as exc:
                self.rec.result, self.rec.reason = exc.result, exc.reason
            except _StepError as exc:
                self.rec.result, self.rec.reason = R.FAILED, exc.reason
            self.rec.finished = R.now()
            self.save()
        except _RecordsFull as exc:  # nothing more is sent to this board: it settles by itself
            self.rec.result, self.rec.reason = R.INTERRUPTED, str(exc)
            return self.rec
        self.ctx.event(self.node.name, self.rec.result)
        return self.rec

    def _status(self, timeout: float | None = None) -> dict[str, Any]:
        """``alma-ota status``, every field the flow reads of the type it expects."""
        st = self.call("status", timeout=timeout)
        if st.get("current_slot") not in SLOTS:
            raise _StepError(f"status: the board names no valid current slot ({str(st.get('current_slot'))[:40]})")
        for k in ("lock", "pending", "slots"):
            st[k] = _dict(st.get(k))
        for k in ("machine", "version", "boot_id", "guard"):
            if not isinstance(st.get(k), str):
                st[k] = None
        return st

    def _flow(self) -> None:
        info, run = self.ctx.info, self.run_name
        try:
            st = self.step("check", self._status)
        except _StepError as exc:
            if self.rec.to_slot and exc.unreachable:  # resumed mid-reboot: it may still come back
                st = self.step("wait", self._wait_boot)
            else:
                raise _Stop(R.FAILED, f"not updated: {exc.reason}") from None
        pend = st.get("pending") or {}
        lock = st.get("lock") or {}
        last = _dict(st.get("last"))
        if not pend and not lock and last.get("run") == run and last.get("result") in ("ROLLED_BACK", "ABORTED"):
            # the board settled this run by itself (a fallback, a rollback, an abort)
            what = R.ROLLED_BACK if last.get("result") == "ROLLED_BACK" else R.FAILED
            raise _Stop(what, f"the board settled it: {last.get('result')} ({last.get('why')})")
        if lock and lock.get("run") != run:
            raise _Stop(
                R.FAILED,
                f"board busy: update run {lock.get('run')} from {lock.get('host') or '?'} "
                f"since {lock.get('since')} holds it (lease until {lock.get('expires')}); nothing done",
            )
        if pend.get("run") == run:
            return self._resume(st, pend)
        self._refuse_if_wrong(st)
        if st.get("version") == info.version:
            if lock.get("run") == run:
                self.call(f"release --run {run}")
            raise _Stop(R.CURRENT, f"already running {info.version} on slot {st.get('current_slot')}")
        self.rec.from_slot = st.get("current_slot")
        self.rec.from_version = st.get("version")
        self.rec.boot_id = st.get("boot_id")
        self.rec.baseline_warnings = self._baseline()
        self.step("lock", lambda: self.call(f"begin --run {run} --host {socket.gethostname()[:60] or 'desktop'}"))
        self.step("push", lambda: self._push(_dict(st.get("received"))))
        down = " --allow-downgrade" if self.ctx.opts.allow_downgrade else ""
        out = self.step("install", lambda: self.call(f"install --run {run}{down}", timeout=self.ctx.opts.push_timeout))
        if out.get("slot") not in SLOTS or out.get("slot") == self.rec.from_slot:
            raise _Stop(R.FAILED, f"install: the board answered target slot {str(out.get('slot'))[:40]} "
                                  f"while running {self.rec.from_slot}: not rebooting it")  # fmt: skip
        self.rec.to_slot = out["slot"]
        cap = _dict(out.get("capsule"))
        self.rec.capsule = {k: cap[k] for k in ("version", "armed", "why") if k in cap} or None
        self.save()
        self._reboot_and_judge()

    def _refuse_if_wrong(self, st: dict[str, Any]) -> None:
        info = self.ctx.info
        if st.get("machine") != info.machine:
            raise _Stop(R.FAILED, f"refused: this .swu is for {info.machine}, the board is {st.get('machine')}")
        running = st.get("version")
        if isinstance(running, str):
            try:
                older = version_tuple(info.version) < version_tuple(running)
            except UserError:
                older = False
            if older and not self.ctx.opts.allow_downgrade:
                raise _Stop(R.FAILED, f"refused: {info.version} is older than the running {running} "
                                      "(no downgrades unless alma update --allow-downgrade)")  # fmt: skip

    def _resume(self, st: dict[str, Any], pend: dict[str, Any]) -> None:
        """The board holds an installed, uncommitted update of this run: continue from its state."""
        if pend.get("slot") not in SLOTS:
            raise _Stop(R.FAILED, f"the board's pending update names no valid slot ({str(pend.get('slot'))[:40]})")
        self.rec.to_slot = pend.get("slot")
        self.rec.from_slot = self.rec.from_slot or (pend.get("from") if pend.get("from") in SLOTS else None)
        if pend.get("rolling_back"):
            if st.get("current_slot") == pend.get("slot"):
                self._reboot_step()
                st = self.step("wait", self._wait_boot)
            return self._finish_rollback(st, "resumed an interrupted rollback")
        if st.get("current_slot") == pend.get("slot") and st.get("boot_id") != self.rec.boot_id:
            return self._judge(st)
        if st.get("current_slot") != pend.get("slot") and self.rec.last_ok() in ("reboot", "wait"):
            return self._fell_back(st)
        self.rec.boot_id = st.get("boot_id")
        return self._reboot_and_judge()

    def _baseline(self) -> list[str]:
        r = self._health()
        return sorted(board_text(c.name, 64) for c in r.checks if c.status is Severity.WARNING)

    def _push(self, got: dict[str, Any]) -> str:
        """Send the .swu; a push cut before (ssh lost, power) goes on at the offset the board has
        (``got``: what the check's status said had arrived; the lock has been ours since)."""
        size = self.ctx.swu.stat().st_size
        n = got.get("bytes")
        have = n if got.get("run") == self.run_name and isinstance(n, int) else 0
        if got.get("complete") and have == size:
            return f"{size} bytes already on the board"
        offset = have if 0 < have < size and not got.get("complete") else 0
        with self.ctx.swu.open("rb") as f:
            f.seek(offset)  # ssh reads the file from here (the descriptor's position is shared)
            self.call(
                f"receive --run {self.run_name} --sha256 {self.ctx.info.sha256} --size {size} --offset {offset}",
                timeout=self.ctx.opts.push_timeout,
                stdin=f.fileno(),
            )
        return f"{size - offset} bytes" + (f" (resumed at {offset})" if offset else "")

    def _reboot_and_judge(self) -> None:
        self._reboot_step()
        st = self.step("wait", self._wait_boot)
        if st.get("current_slot") != self.rec.to_slot:
            return self._fell_back(st)
        return self._judge(st)

    def _wait_boot(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.ctx.opts.boot_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            self._check_cancel()
            try:
                st = self._status(timeout=min(30.0, self.ctx.opts.step_timeout))
            except _StepError as exc:
                last = exc.reason
            else:
                if st.get("boot_id") and st.get("boot_id") != self.rec.boot_id:
                    return st
                last = "still the old boot (same boot id)"
            self._sleep(self.ctx.opts.poll_s)
        raise _Stop(
            R.LOST,
            f"did not come back within {self.ctx.opts.boot_timeout:.0f} s ({last}); its bootloader "
            "falls back to the old slot after its retries: power-cycle it, then run the same "
            "command again",
        )

    def _sleep(self, s: float) -> None:
        end = time.monotonic() + s
        while time.monotonic() < end and not self.ctx.cancel.expired():
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _fell_back(self, st: dict[str, Any], when: str = "") -> None:
        cur = st.get("current_slot")
        self.step("rollback", lambda: self.call(f"rollback --run {self.run_name}"))
        what = f"fell back {when}" if when else "did not boot"
        raise _Stop(
            R.ROLLED_BACK,
            f"the new slot {self.rec.to_slot} {what}: the bootloader fell back to "
            f"slot {cur} (capsule status {_dict(st.get('slots')).get('capsule_status')}); "
            f"running {st.get('version')} on slot {cur}",
        )

    def _health(self, deadline: float | None = None) -> Any:
        """One health report, bounded by the health window (``--health-timeout``)."""
        if deadline is None:
            deadline = time.monotonic() + self.ctx.opts.health_timeout
        res = self.ctx.remote(
            self.node,
            self.node.health_command,
            self.ctx.fleet.ssh,
            timeout=self._left(deadline),
            cancel=self.ctx.cancel,
            max_output=self.ctx.fleet.max_output,
        )
        self._log(res)
        self._drop_dead_link(res)
        return node_from_remote(res, self.node, now=utc_now(), stale_after=self.ctx.fleet.stale_after)

    def _verdict(self, st: dict[str, Any], deadline: float) -> str | None:
        """None when healthy, else why not."""
        if st.get("guard") != "active":
            return f"the guard is not running ({st.get('guard')})"
        h = self._health(deadline)
        summary = board_text(h.summary)
        self.rec.health = {"status": h.status.name, "summary": summary}
        if h.status is Severity.OK:
            return None
        if h.status is Severity.WARNING:
            new = sorted(
                board_text(c.name, 64)
                for c in h.checks
                if c.status is Severity.WARNING and board_text(c.name, 64) not in self.rec.baseline_warnings
            )
            if not new and not any(c.status is Severity.CRITICAL for c in h.checks):
                return None
            return f"health WARNING, new since the update: {', '.join(new)[:MAX_TEXT]} ({summary})"
        return f"health {h.status.name}: {summary}"

    def _judge(self, st: dict[str, Any]) -> None:
        """Health on the new slot until OK or the deadline. Every judgement is of the slot and
        the boot it was taken on: a board that fell back (or rebooted) meanwhile is not judged
        by what its other slot or an earlier boot said."""
        deadline = time.monotonic() + self.ctx.opts.health_timeout
        p = self.phase("health")
        boot = st.get("boot_id")
        why = "no verdict"
        answered = ""  # the last verdict the board's health report itself gave
        while True:
            try:
                why = self._verdict(st, deadline) or ""
                if not why.startswith("health UNKNOWN"):
                    answered = why
                if not why:  # confirm the verdict was of this slot and this boot
                    st = self._status(timeout=self._left(deadline))
                    if st.get("current_slot") == self.rec.to_slot and st.get("boot_id") != boot:
                        why, boot = "the board rebooted during the health check: judging again", st.get("boot_id")
            except _StepError as exc:
                why = exc.reason
            if st.get("current_slot") != self.rec.to_slot:
                self.done(p, "failed", f"the board fell back to slot {st.get('current_slot')} during the health check")
                return self._fell_back(st, "during the health check")
            if not why:
                self.done(p, "ok", self.rec.health.get("summary") if self.rec.health else None)
                break
            if time.monotonic() >= deadline or self.ctx.cancel.expired():
                self._check_cancel_in(p)
                why = answered or why  # a call the closing window cut short does not replace an answer
                self.done(p, "failed", why)
                return self._rollback(why)
            self._sleep(self.ctx.opts.poll_s)
            try:
                st = self._status(timeout=self._left(deadline))
            except _StepError as exc:
                why = exc.reason
        out = self.step("commit", lambda: self.call(f"commit --run {self.run_name}"))
        raise _Stop(R.COMMITTED, f"running {self.ctx.info.version} on slot {out.get('committed')}, healthy, committed")

    def _left(self, deadline: float) -> float:
        """What is left of the health window for one call (at least a second, at most a step)."""
        return max(1.0, min(self.ctx.opts.step_timeout, deadline - time.monotonic()))

    def _check_cancel_in(self, p: R.Phase) -> None:
        if self.ctx.cancel.expired():
            self.done(p, "interrupted", "interrupted before a verdict: nothing committed")
            raise _Stop(R.INTERRUPTED, "interrupted before the health verdict: nothing committed; run again to resume")

    def _rollback(self, why: str) -> None:
        out = self.step("rollback", lambda: self.call(f"rollback --run {self.run_name}"))
        if not out.get("reboot_needed"):
            raise _Stop(R.ROLLED_BACK, f"{why}; rolled back to slot {out.get('rolled_back_to')}")
        self._reboot_step()
        st = self.step("wait", self._wait_boot)
        self._finish_rollback(st, why)

    def _reboot_step(self) -> None:
        p = self.phase("reboot")
        try:
            st = self._status()
            self.rec.boot_id = st.get("boot_id")
            self.call(f"reboot --run {self.run_name}", timeout=30)
        except _StepError as exc:
            if not exc.unreachable:  # the connection dropping is what a reboot does
                self.done(p, "failed", exc.reason)
                raise
        self._drop_dead_link()
        self.done(p)

    def _finish_rollback(self, st: dict[str, Any], why: str) -> None:
        out = self.step("rollback", lambda: self.call(f"rollback --run {self.run_name}"))
        raise _Stop(
            R.ROLLED_BACK, f"{why}; rolled back: running slot {out.get('rolled_back_to')} ({st.get('version')}) again"
        )


@dataclass
class RunReport:
    run: str
    waves: list[list[str]]
    records: list[R.UpdateRecord]

    @property
    def exit_code(self) -> int:
        results = {r.result for r in self.records}
        if results & {R.LOST}:
            return EXIT_LOST
        if results & {R.INTERRUPTED, R.IN_PROGRESS}:
            return 130
        return EXIT_OK if results <= set(R.GOOD) else EXIT_SOME_FAILED


def _failed(rec: R.UpdateRecord) -> bool:
    return rec.result not in R.GOOD and rec.result != R.SKIPPED


def run_update(ctx: Context, nodes: list[Node]) -> RunReport:
    """Update ``nodes`` in waves; records are written as it goes (see the module docstring).
    Each board's calls share one ssh connection per boot, closed when the run ends."""
    fleet = ctx.fleet
    with run_connections(fleet.ssh, nodes) as ssh:
        ctx.fleet = dataclasses.replace(fleet, ssh=ssh)
        try:
            return _run_waves(ctx, nodes)
        finally:
            ctx.fleet = fleet


def _run_waves(ctx: Context, nodes: list[Node]) -> RunReport:
    waves = plan_waves(nodes, ctx.opts.canary, ctx.opts.batch)
    # Every record read (and checked) before any board is touched: a bad one stops the run here.
    start = {n.name: _start_record(ctx, n, w) for w, wave in enumerate(waves, start=1) for n in wave}
    out: dict[str, R.UpdateRecord] = {}
    failures = 0
    with ThreadPoolExecutor(max_workers=max(1, max((len(w) for w in waves), default=1))) as pool:
        for wave in waves:
            if ctx.records_error:
                break
            stop = failures > ctx.opts.max_failures or ctx.cancel.expired()
            futures = {}
            for n in wave:
                rec = start[n.name]
                if rec.final:
                    out[n.name] = rec
                    continue
                if stop:
                    rec.result = R.SKIPPED if not ctx.cancel.expired() else R.INTERRUPTED
                    rec.reason = (
                        f"not attempted: {failures} board(s) failed before (max failures {ctx.opts.max_failures})"
                        if rec.result == R.SKIPPED
                        else "interrupted before this board's wave"
                    )
                    R.save(ctx.root, rec)
                    out[n.name] = rec
                    continue
                futures[n.name] = pool.submit(BoardUpdate(ctx, n, rec).run)
            try:
                pending = set(futures.values())
                while pending:
                    _, pending = wait_futures(pending, timeout=0.2)
            except KeyboardInterrupt:
                ctx.cancel.reset(0, "interrupted")
                wait_futures(list(futures.values()))
            for name, fut in futures.items():
                out[name] = fut.result()
                failures += _failed(out[name])
    if ctx.records_error:
        raise RecordsUnwritable(
            f"{ctx.records_error}: alma update stopped before sending any board anything more",
            hint="free space there (or pass --records DIR), then run the same command again; meanwhile each "
            "board settles by itself (a board left on a new slot rolls back after its verify deadline, docs/ota.md)",
        )
    report = RunReport(ctx.run, [[n.name for n in w] for w in waves], [out[n.name] for n in nodes])
    if ctx.cancel.expired():
        raise Interrupted(
            "alma update interrupted: every board's record says where it stopped; run the same command again to resume"
        )
    return report


def _start_record(ctx: Context, node: Node, wave: int) -> R.UpdateRecord:
    old = R.load_existing(ctx.root, ctx.info.sha256, node.name)
    # FAILED (refused or stopped before the switch: the board runs its old slot) and LOST are
    # tried again by the same command; the board's own state says where to go on.
    if old is not None and old.final and old.result not in (R.SKIPPED, R.FAILED):
        return old
    if old is not None and old.result != R.SKIPPED:
        old.result, old.reason, old.finished, old.wave = R.IN_PROGRESS, None, None, wave
        return old
    return R.UpdateRecord(
        node=node.name,
        run=ctx.run,
        swu_sha256=ctx.info.sha256,
        swu_version=ctx.info.version,
        machine=ctx.info.machine,
        started=R.now(),
        wave=wave,
    )


def dry_run(ctx: Context, nodes: list[Node]) -> list[dict[str, Any]]:
    """The plan: per wave, per board, which slot it runs, which it would write, the capsule."""
    rows: list[dict[str, Any]] = []
    cap = ctx.info.capsule
    for i, wave in enumerate(plan_waves(nodes, ctx.opts.canary, ctx.opts.batch), start=1):
        for n in wave:
            row: dict[str, Any] = {"wave": i, "node": n.name}
            probe = BoardUpdate(ctx, n, _start_record(ctx, n, i))
            probe.log_path = None
            try:
                st = probe._status()
            except _StepError as exc:
                row.update(action="unknown", why=exc.reason)
                rows.append(row)
                continue
            cur = st.get("current_slot")
            row.update(current_slot=cur, target_slot="b" if cur == "a" else "a", running=st.get("version"))
            bl = st["slots"].get("bootloader_version")
            if cap is None:
                row["capsule"] = "none in the .swu"
            elif cap.version == bl:
                row["capsule"] = f"skip (bootloader already {bl})"
            else:
                row["capsule"] = f"{bl} -> {cap.version}"
            if st.get("machine") != ctx.info.machine:
                row.update(action="refuse", why=f"board is {st.get('machine')}")
            elif st.get("version") == ctx.info.version:
                row.update(action="none", why="already running this version")
            else:
                row["action"] = "update"
            rows.append(row)
    return rows
