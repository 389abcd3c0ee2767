"""The owner's return reaches the job's stop without waiting on anything else: a login with no
terminal (a logind session) is seen on the next poll, not the next slow poll; between two
polls the owner alone is looked for every ``owner_poll``; the stop comes before the poll's
heartbeat. Behaviour, never timing: fake clocks and what each step did, in what order."""

from __future__ import annotations

import os
import time

from erangrid import presence


def _session(machine, name: str, started: float) -> None:
    """What logind does at a login: the session file written aside and renamed in."""
    tmp = machine.sessions / f".#{name}"
    keys = f"UID=1000\nUSER=alma\nACTIVE=1\nSTATE=active\nTYPE=tty\nCLASS=user\nREALTIME={int(started * 1e6)}\n"
    tmp.write_text(keys)
    os.replace(tmp, machine.sessions / name)


def _running(g, agent) -> None:
    g.hashchain(10_000_000, every=5.0)
    agent.start()
    g.drive(agent, lambda: agent.proc is not None and not agent.proc.stopped)


def test_a_login_without_a_terminal_stops_the_job_on_the_next_poll(grid, machine):
    """`ssh board cmd` makes a logind session and no pts. The sessions were read once per slow
    poll and judged every poll against that copy: an owner who kept logging in was seen late
    and lost between reads (the job resumed under him, and its pause never reached
    vacate_after on the virtual board)."""
    g = grid(slow_poll=3600.0)  # the slow sensors are not read again in this test
    agent = g.agent()
    _running(g, agent)
    assert agent.step().startswith("running job")
    _session(machine, "c7", time.time())
    line = agent.step()
    assert line.startswith("paused job") and "session c7" in line, line
    assert agent.proc is not None and agent.proc.stopped
    agent.shutdown()


def test_the_session_files_are_read_again_only_when_the_directory_changed(machine, monkeypatch):
    reads = []
    real = presence._read_sessions
    monkeypatch.setattr(presence, "_read_sessions", lambda d: reads.append(d) or real(d))
    now = time.time()
    _session(machine, "3", now - 40)
    watch = presence.SessionWatch(machine.sessions, refresh=3600.0)
    assert watch.read(now).what == "session 3"
    for _ in range(50):
        assert watch.read(now).at == int((now - 40) * 1e6) / 1e6
    assert len(reads) == 1  # one stat per poll while nothing changed
    _session(machine, "4", now)
    assert watch.read(now).what == "session 4"
    (machine.sessions / "4").unlink()  # the logout
    assert watch.read(now).what == "session 3"
    assert len(reads) == 3


class FakeTime:
    """Monotonic and wall clocks that move only when the agent sleeps."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall0 = time.time()
        self.sleeps: list[float] = []
        self.on_sleep = lambda: None

    def monotonic(self) -> float:
        return self.mono

    def clock(self) -> float:
        return self.wall0 + self.mono - 1000.0

    def sleep(self, dt: float) -> None:
        self.sleeps.append(dt)
        self.mono += dt
        time.sleep(0.001)  # the real job and the real files go on meanwhile
        self.on_sleep()


def test_between_polls_the_owner_alone_is_looked_for_and_his_return_starts_the_poll(grid, machine):
    """poll = 5 s: the owner who returns 1 s after a poll has his job stopped within one
    owner_poll, not at the next poll 4 s later."""
    t = FakeTime()
    g = grid(poll=5.0, idle_poll=5.0, slow_poll=3600.0)  # owner_poll: its default, 0.05 s
    agent = g.agent(clock=t.clock, monotonic=t.monotonic)
    g.hashchain(10_000_000, every=5.0)
    seen: dict[str, float] = {}

    def owner_returns() -> None:
        if agent.proc is not None and "running" not in seen:
            seen["running"] = t.mono
        if "running" in seen and "back" not in seen and t.mono - seen["running"] >= 1.0:
            seen["back"] = t.mono
            machine.touch_pts(4, t.clock())

    def stopped() -> bool:
        if agent.proc is not None and agent.proc.stopped:
            seen.setdefault("stopped", t.mono)
            return True
        return t.mono > 1000.0 + 60.0  # a bound in fake seconds: never a real hang

    t.on_sleep = owner_returns
    agent.run(stopped, sleep=t.sleep)
    assert "stopped" in seen, (seen, g.lines[-5:])
    assert seen["stopped"] - seen["back"] <= 0.05 + 1e-6, seen  # one owner_poll, not the 5 s poll
    assert max(t.sleeps) <= 5.0


def test_the_owner_is_stopped_for_before_the_heartbeat_of_the_same_poll(grid, machine):
    """The heartbeat packs the checkpoint and commits to the queue (an fsync a flooded disk
    can stall for seconds): a poll that owes one stops the job first."""
    g = grid()
    agent = g.agent()
    _running(g, agent)
    order: list[tuple[str, bool]] = []
    real = agent.backend.heartbeat

    def heartbeat(lease, ckpt):
        order.append(("heartbeat", bool(agent.proc and agent.proc.stopped)))
        return real(lease, ckpt)

    agent.backend.heartbeat = heartbeat
    agent.last_hb = float("-inf")  # a heartbeat is due at this poll
    machine.touch_pts(5, time.time())
    assert agent.step().startswith("paused job")
    assert order == [("heartbeat", True)]
    agent.shutdown()
