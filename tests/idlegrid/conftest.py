"""Fixtures for ERAN-GRID: a fake machine tree (power supplies, thermal zones, /dev/pts whose
access times the test sets, logind session files, the guard's state file) and helpers to
build an agent on it with a real SQLite queue and real child processes."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import hypothesis  # noqa: F401 - import before any test starts a thread: CPython 3.11's parser
import pytest  # is not thread-safe (SystemError "AST constructor recursion depth mismatch")
from support import DEADLINE_S

IDLEGRID = Path(__file__).resolve().parents[2] / "tools" / "idlegrid"
if str(IDLEGRID) not in sys.path:
    sys.path.insert(0, str(IDLEGRID))

HASHCHAIN = IDLEGRID / "examples" / "hashchain.py"
ERAN_GRID = IDLEGRID / "eran-grid"


class FakeMachine:
    """A machine tree under ``root``; /proc is the real one (jobs are real processes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ps = root / "sys/class/power_supply"
        self.thermal = root / "sys/class/thermal"
        self.pts = root / "dev/pts"
        self.sessions = root / "run/systemd/sessions"
        self.guard = root / "run/alma-guard/state.json"
        for d in (self.ps, self.thermal, self.pts, self.sessions, self.guard.parent):
            d.mkdir(parents=True, exist_ok=True)
        (root / "proc").symlink_to("/proc")
        (self.pts / "ptmx").write_text("")
        self.supply("ADP1", "Mains", online=True)
        self.zone(0, "cpu-thermal", 45.0)
        self.zone(1, "tj-thermal", 50.0)
        self.guard_state(shedding=False)

    def supply(
        self, name: str, kind: str, online: bool | None = None, status: str | None = None, scope: str | None = None
    ) -> None:
        d = self.ps / name
        d.mkdir(exist_ok=True)
        (d / "type").write_text(kind + "\n")
        if online is not None:
            (d / "online").write_text("1\n" if online else "0\n")
        if status is not None:
            (d / "status").write_text(status + "\n")
        if scope is not None:
            (d / "scope").write_text(scope + "\n")

    def zone(self, n: int, name: str, celsius: float) -> None:
        d = self.thermal / f"thermal_zone{n}"
        d.mkdir(exist_ok=True)
        (d / "type").write_text(name + "\n")
        (d / "temp").write_text(f"{int(celsius * 1000)}\n")

    def guard_state(self, shedding: bool, updated: float | None = None, reason: str = "") -> None:
        ts = datetime.fromtimestamp(time.time() if updated is None else updated, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        tmp = self.guard.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "schema": "alma.guard-state/1",
                    "updated": ts,
                    "shedding": shedding,
                    "since": ts,
                    "reason": reason,
                    "zones": {},
                    "unreadable": [],
                }
            )
        )
        os.replace(tmp, self.guard)

    def touch_pts(self, n: int, at: float) -> Path:
        """The owner typed into pts/n at time ``at`` (the kernel moves atime on reads)."""
        p = self.pts / str(n)
        if not p.exists():
            p.write_text("")
        os.utime(p, (at, at))
        return p

    def config(self, tmp: Path, **over: object) -> dict[str, object]:
        data: dict[str, object] = {
            "enabled": True,
            "node": "node-a",
            "poll": 0.05,
            "slow_poll": 0.0,  # read every signal on every step: tests step back to back
            "idle_after": 1.0,
            "vacate_after": 30.0,
            "grace": 2.0,
            "heat_holdoff": 0.5,
            "lease_ttl": 30.0,
            "root": str(self.root),
            "state_dir": str(tmp / "state"),
            "status_path": str(tmp / "state" / "status.json"),
            "cpu_busy": 1.01,  # the test machine is busy with other tests: presence via pts here
            # The fake guard state is written once; a slow run of a long test must not see it
            # go stale (the staleness rule has its own tests).
            "guard_stale_after": 3600.0,
            "queue": {"backend": "sqlite", "path": str(tmp / "queue.db")},
        }
        data.update(over)
        return data


@pytest.fixture
def machine(tmp_path: Path) -> FakeMachine:
    return FakeMachine(tmp_path / "root")


@pytest.fixture
def idlegrid_path() -> Path:
    return IDLEGRID


def to_toml(data: dict[str, object]) -> str:
    """Enough TOML for our config: scalars at top, then tables (strings JSON-quoted)."""

    def val(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        return json.dumps(str(v))

    top = [f"{k} = {val(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [
        f"\n[{k}]\n" + "\n".join(f"{kk} = {val(vv)}" for kk, vv in v.items())
        for k, v in data.items()
        if isinstance(v, dict)
    ]
    return "\n".join(top) + "\n" + "\n".join(tables) + "\n"


def expected_digest(seed: bytes, steps: int) -> str:
    import hashlib

    d = hashlib.sha256(seed).digest()
    for _ in range(steps):
        d = hashlib.sha256(d).digest()
    return d.hex()


class Grid:
    """An agent on a fake machine with a real SQLite queue and real child processes."""

    def __init__(self, machine: FakeMachine, tmp: Path, **over: object) -> None:
        from erangrid.config import from_mapping
        from erangrid.sqlite_queue import SqliteQueue

        self.machine = machine
        self.tmp = tmp
        self.data = machine.config(tmp, **over)
        self.cfg = from_mapping(self.data)
        self.queue = SqliteQueue(self.cfg.queue.path, max_failures=self.cfg.max_failures, backoff=0.0)
        self.lines: list[str] = []
        machine.touch_pts(0, time.time() - 3600)  # the owner left an hour ago

    def agent(self, node: str | None = None, **kw: object):
        import dataclasses

        from erangrid.agent import Agent
        from erangrid.sqlite_queue import SqliteQueue

        cfg = self.cfg if node is None else dataclasses.replace(self.cfg, node=node)
        backend = SqliteQueue(cfg.queue.path, max_failures=cfg.max_failures, lease_ttl=cfg.lease_ttl, backoff=0.0)
        return Agent(cfg, backend, log=self.lines.append, **kw)

    def hashchain(self, steps: int, seed: bytes = b"seed", every: float = 0.05) -> str:
        return self.queue.submit(
            [sys.executable, str(HASHCHAIN), "--steps", str(steps), "--every", str(every)], seed, name="hashchain"
        )

    def config_file(self, drop: tuple[str, ...] = (), **over: object) -> Path:
        data = {k: v for k, v in self.data.items() if k not in drop}
        data.update(over)
        path = self.tmp / "eran-grid.toml"
        path.write_text(to_toml(data))
        return path

    def wait_checkpoint(self, agent, timeout: float = DEADLINE_S) -> None:
        """step() the agent until its running job has written a first checkpoint: the job is a
        fresh interpreter behind the wrapper, and on a loaded host a fixed sleep can end before
        it installed its SIGTERM handler (then a vacate finds nothing to resume from)."""
        from erangrid.jobs import job_dir

        state = job_dir(self.cfg.state_dir, agent.lease.job.id) / "home" / "checkpoint" / "state.json"
        self.drive(agent, state.exists, timeout=timeout, poll=0.05)

    @staticmethod
    def drive(agent, until, timeout: float = DEADLINE_S, poll: float | None = None) -> str:
        """step() the agent with real sleeps until ``until()`` is true; returns the last line."""
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = agent.step()
            if until():
                return line
            time.sleep(poll if poll is not None else agent.cfg.poll)
        raise AssertionError(f"timed out; last line: {line}")


@pytest.fixture
def grid(machine: FakeMachine, tmp_path: Path):
    return lambda **over: Grid(machine, tmp_path, **over)


@pytest.fixture
def hashchain_path() -> Path:
    return HASHCHAIN


@pytest.fixture
def eran_grid_cmd() -> list[str]:
    return [sys.executable, str(ERAN_GRID)]


@pytest.fixture
def digest():
    return expected_digest


@pytest.fixture
def nats_server(tmp_path: Path):
    from support import require_tool
    from support_nats import NatsServer

    server = NatsServer(require_tool("nats-server"), tmp_path / "js")
    server.start()
    yield server
    server.stop()
