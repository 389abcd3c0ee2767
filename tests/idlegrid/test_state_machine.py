"""A hypothesis state machine drives random owner activity, heat, battery, agent crashes,
submissions and job completions through the real agent and the real SQLite queue, on a fake
clock with fake job processes (so it is deterministic and fast). Invariants: every submitted
job is done with exactly one accepted result or is still in the queue (none dead, none lost),
and no job runs more than one poll while the owner is present, the board is hot or on battery.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from erangrid.agent import Agent
from erangrid.config import from_mapping
from erangrid.sqlite_queue import SqliteQueue
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

POLL = 0.2
T0 = 1_900_000_000.0


class World:
    def __init__(self) -> None:
        self.t = T0
        self.procs: list[FakeProc] = []

    def clock(self) -> float:
        return self.t


class FakeProc:
    """A job that needs ``units`` polls of CPU; checkpoints every poll; SIGTERM → checkpoint
    and exit 75 at its next chance; dies with its agent like the real PR_SET_PDEATHSIG."""

    _next_pid = 10_000_000

    def __init__(self, world: World, command: list[str], workdir: Path, input_path: Path, env: dict[str, str]):
        self.world = world
        self.units = int(command[1])
        self.job_id = env["ERAN_GRID_JOB_ID"]
        self.ckpt = Path(env["ERAN_GRID_CHECKPOINT_DIR"]) / "progress"
        self.done = int(self.ckpt.read_text()) if self.ckpt.exists() else 0
        self.stdout_path = workdir / "stdout"
        self.stderr_path = workdir / "stderr"
        self.stdout_path.write_bytes(b"")
        self.stderr_path.write_bytes(b"")
        FakeProc._next_pid += 1
        self.pid = self.pgid = FakeProc._next_pid
        self.stopped = False
        self.terminating = False
        self.rc: int | None = None
        self.forbidden_streak = 0.0  # how long it has run without a break while it must not
        self.limit_hit = lambda: ""  # no live cap in this world (the wrapper's, tested for real)
        self.worst_streak = 0.0
        world.procs.append(self)

    def advance(self, dt: float, forbidden: bool) -> None:
        if self.rc is not None or self.stopped or not forbidden:
            self.forbidden_streak = 0.0  # stopped (or allowed): the streak is over
        if self.rc is not None or self.stopped:
            return
        if self.terminating:
            self.ckpt.write_text(str(self.done))
            self.rc = 75
            return
        if forbidden:
            self.forbidden_streak += dt
            self.worst_streak = max(self.worst_streak, self.forbidden_streak)
        self.done += 1
        self.ckpt.write_text(str(self.done))
        if self.done >= self.units:
            self.stdout_path.write_text(f"{self.job_id}:{self.units}")
            self.rc = 0

    def stop(self) -> None:
        self.stopped = True

    def cont(self) -> None:
        self.stopped = False

    def terminate(self) -> None:
        self.stopped = False
        self.terminating = True

    def kill(self) -> None:
        if self.rc is None:
            self.rc = -9

    def poll(self) -> int | None:
        return self.rc

    def wait(self, timeout: float | None = None) -> int:
        if self.rc is None:
            self.rc = -9
        return self.rc

    def reap_group(self) -> None:
        pass


class CountingQueue(SqliteQueue):
    accepted: dict[str, int]

    def complete(self, lease, outcome):  # type: ignore[no-untyped-def]
        ok = super().complete(lease, outcome)
        if ok:
            self.accepted[lease.job.id] = self.accepted.get(lease.job.id, 0) + 1
            assert outcome.result == f"{lease.job.id}:{lease.job.command[1]}".encode()
        return ok


@settings(
    max_examples=20,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
class GridMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="erangrid-sm-"))
        root = self.tmp / "root"
        for d in ("sys/class/power_supply/ADP1", "sys/class/thermal/thermal_zone0", "dev/pts"):
            (root / d).mkdir(parents=True)
        (root / "proc").symlink_to("/proc")
        (root / "sys/class/power_supply/ADP1/type").write_text("Mains\n")
        self.world = World()
        self.root = root
        self.cfg = from_mapping(
            {
                "enabled": True,
                "node": "sm",
                "poll": POLL,
                "slow_poll": POLL,
                "idle_after": 1.0,
                "vacate_after": 1.0,
                "grace": 0.4,
                "heat_holdoff": 0.6,
                "lease_ttl": 2.0,
                "max_failures": 1000,
                "cpu_busy": 1.01,
                "require_guard": False,
                "root": str(root),
                "state_dir": str(self.tmp / "state"),
                "status_path": str(self.tmp / "status.json"),
                "thermal": {"guard_state": ""},
                "queue": {"backend": "sqlite", "path": str(self.tmp / "q.db")},
            }
        )
        self.accepted: dict[str, int] = {}
        self.admin = SqliteQueue(self.cfg.queue.path, clock=self.world.clock)
        self.submitted: list[str] = []
        self.owner_here = False
        self.hot = False
        self.on_battery = False
        self._set_owner(False)
        self._set_heat(False)
        self._set_power(False)
        self.agent = self._new_agent()

    def _new_agent(self) -> Agent:
        backend = CountingQueue(
            self.cfg.queue.path,
            max_failures=self.cfg.max_failures,
            lease_ttl=self.cfg.lease_ttl,
            clock=self.world.clock,
            backoff=0.0,
        )
        backend.accepted = self.accepted
        agent = Agent(
            self.cfg,
            backend,
            clock=self.world.clock,
            monotonic=self.world.clock,
            spawn=lambda *a, **_kw: FakeProc(self.world, *a),
        )
        agent.start()
        return agent

    def _set_owner(self, here: bool) -> None:
        self.owner_here = here
        at = self.world.t if here else self.world.t - 3600
        pts = self.root / "dev/pts/0"
        pts.touch()
        os.utime(pts, (at, at))

    def _set_heat(self, hot: bool) -> None:
        self.hot = hot
        zone = self.root / "sys/class/thermal/thermal_zone0"
        (zone / "type").write_text("tj-thermal\n")
        (zone / "temp").write_text("95000\n" if hot else "40000\n")

    def _set_power(self, battery: bool) -> None:
        self.on_battery = battery
        (self.root / "sys/class/power_supply/ADP1/online").write_text("0\n" if battery else "1\n")
        bat = self.root / "sys/class/power_supply/BAT0"
        bat.mkdir(exist_ok=True)
        (bat / "type").write_text("Battery\n")
        (bat / "status").write_text("Discharging\n" if battery else "Charging\n")

    def _forbidden(self) -> bool:
        return self.owner_here or self.hot or self.on_battery

    # -- rules --------------------------------------------------------------------------
    @rule(units=st.integers(min_value=1, max_value=12))
    def submit(self, units: int) -> None:
        self.submitted.append(self.admin.submit(["fake", str(units)]))

    @rule(polls=st.integers(min_value=1, max_value=8))
    def time_passes(self, polls: int) -> None:
        for _ in range(polls):
            self.world.t += POLL
            forbidden = self._forbidden()
            for proc in self.world.procs:
                proc.advance(POLL, forbidden)
            if self.owner_here:
                self._set_owner(True)  # the owner keeps typing
            self.agent.step()

    @rule()
    def owner_returns(self) -> None:
        self._set_owner(True)

    @rule()
    def owner_leaves(self) -> None:
        self._set_owner(False)

    @rule(hot=st.booleans())
    def heat(self, hot: bool) -> None:
        self._set_heat(hot)

    @rule(battery=st.booleans())
    def power(self, battery: bool) -> None:
        self._set_power(battery)

    @rule()
    def agent_crashes(self) -> None:
        """kill -9: no shutdown, the job dies with the agent, the same node restarts."""
        for proc in self.world.procs:
            proc.kill()
        if self.agent._lock_fd is not None:  # the kernel drops a dead agent's state-dir lock
            os.close(self.agent._lock_fd)
        self.agent = self._new_agent()

    @precondition(lambda self: self.agent.proc is not None)
    @rule()
    def job_checks_in(self) -> None:
        """Only the agent's own poll moves time for the job: nothing to do but step once."""
        self.world.t += POLL
        for proc in self.world.procs:
            proc.advance(POLL, self._forbidden())
        self.agent.step()

    # -- invariants ---------------------------------------------------------------------
    @invariant()
    def no_job_runs_more_than_one_poll_while_forbidden(self) -> None:
        for proc in self.world.procs:
            assert proc.worst_streak <= POLL + 1e-9, "a job kept running after the owner/heat/battery"

    @invariant()
    def every_job_done_once_or_still_queued(self) -> None:
        if not hasattr(self, "admin"):
            return
        rows = {r["id"]: r for r in self.admin.jobs()}
        assert sorted(rows) == sorted(self.submitted)
        for job_id, row in rows.items():
            assert row["state"] in ("queued", "leased", "done"), row
            assert self.accepted.get(job_id, 0) == (1 if row["state"] == "done" else 0)

    def teardown(self) -> None:
        if not hasattr(self, "admin"):
            return
        try:
            # Let the machine be idle, cool and on AC: everything submitted must finish, once.
            self._set_owner(False)
            self._set_heat(False)
            self._set_power(False)
            for _ in range(2000):
                if all(r["state"] == "done" for r in self.admin.jobs()):
                    break
                self.world.t += POLL
                for proc in self.world.procs:
                    proc.advance(POLL, False)
                self.agent.step()
            rows = self.admin.jobs()
            assert all(r["state"] == "done" for r in rows), [(r["id"], r["state"]) for r in rows]
            assert all(self.accepted[r["id"]] == 1 for r in rows)
        finally:
            self.agent.backend.close()
            self.admin.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


TestGrid = GridMachine.TestCase
