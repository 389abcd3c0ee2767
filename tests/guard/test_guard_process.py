"""The real alma-guard process end to end: sd_notify over a real socket, real work paused
and resumed, SIGTERM vs kill -9, and the forensics the next boot reads; plus the cgroup v2
freeze path on this machine's own cgroup2 hierarchy where it may create a child group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from almaboard.paths import Paths
from almaguard.config import GuardConfig
from almaguard.guard import Guard
from almaguard.pause import Pauser
from support import wait_for
from support_guard import ALMA_GUARD, FakeBoard, orin_zones, proc_state, spawn_worker, wait_state

FAST = """[guard]
interval_s = 0.1
holdoff_s = 0.5
state_every_s = 1.0
ring_every_s = 0.2
"""


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)
        self.messages: list[str] = []

    def drain(self, until: float) -> list[str]:
        while time.monotonic() < until:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
        return self.messages

    def wait_for(self, needle: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.messages.append(msg)
            if needle in msg:
                return msg
        raise AssertionError(f"no {needle!r} from the guard; got {self.messages[-5:]}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.close()


def wait_json(path: Path, ok: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> dict[str, Any]:
    """The file's JSON once ``ok`` holds (the guard signals first, then writes its state)."""
    deadline = time.monotonic() + timeout
    data: dict[str, Any] = {}
    while time.monotonic() < deadline:
        data = json.loads(path.read_text())
        if ok(data):
            return data
        time.sleep(0.01)
    raise AssertionError(f"{path} never satisfied the condition: {data}")


def start_guard(board: FakeBoard, notify: NotifySocket | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    if notify:
        env["NOTIFY_SOCKET"] = str(notify.path)
        env["WATCHDOG_USEC"] = "2000000"
    return subprocess.Popen(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def guard_json(board: FakeBoard, *args: str) -> tuple[int, dict[str, object]]:
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.returncode, json.loads(r.stdout)


def reboot(board: FakeBoard, boot_id: str, children: list[subprocess.Popen[bytes]]) -> None:
    """What a reset does to the tree: processes gone, /run empty, a new boot id."""
    for c in children:
        os.kill(c.pid, signal.SIGCONT)
        c.kill()
        c.wait(timeout=5)
    for p in sorted(board.p("/run").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    board.set_boot_id(boot_id)


@pytest.mark.slow
def test_real_guard_notifies_pauses_resumes_and_stops_cleanly(
    board: FakeBoard, notify: NotifySocket, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 50.0)
    board.write_config("guard.toml", FAST)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    guard = start_guard(board, notify)
    try:
        assert "READY=1" in notify.wait_for("READY=1")
        msgs = notify.drain(time.monotonic() + 1.0)
        keepalives = sum(m.count("WATCHDOG=1") for m in msgs)
        assert 5 <= keepalives <= 15  # one per 0.1 s poll, well inside WatchdogSec

        board.set_temp("soc1-thermal", 95.0)
        assert wait_state(w.pid, {"T"}, 10) == "T"
        assert "shedding: soc1-thermal 95.0 C >= shed 89.0 C" in notify.wait_for("STATUS=shedding")
        state = wait_json(board.p("/run/alma-guard/state.json"), lambda s: s["shedding"])
        assert "soc1-thermal" in state["reason"]

        board.set_temp("soc1-thermal", 50.0)
        assert wait_state(w.pid, {"R", "S"}, 10) in {"R", "S"}
        notify.wait_for("STATUS=normal")

        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=10) == 0
        assert "STOPPING=1" in "".join(notify.drain(time.monotonic() + 0.3))
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()
    marker = json.loads(board.p("/var/lib/alma-guard/clean-shutdown").read_text())
    assert marker["boot_id"] == board.boot_id
    ring = json.loads(board.p("/var/lib/alma-guard/ring.json").read_text())
    assert max(s["max_c"] for s in ring["samples"]) == 95.0

    reboot(board, "0b0e5a0c-0000-4000-8000-000000000002", children)
    code, out = guard_json(board, "resets")
    assert code == 0
    assert out["pending"]["ended"] == "clean"  # type: ignore[index]


@pytest.mark.slow
def test_forensics_after_kill_9_while_hot(
    board: FakeBoard, notify: NotifySocket, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 50.0)
    board.write_config("guard.toml", FAST)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    guard = start_guard(board, notify)
    notify.wait_for("READY=1")
    board.set_temp("tj-thermal", 93.0)
    notify.wait_for("STATUS=shedding")
    ring = board.p("/var/lib/alma-guard/ring.json")

    def hot_on_disk() -> bool:  # a ring flush while hot and shedding reached the disk
        try:
            last = json.loads(ring.read_text())["samples"][-1]
        except (OSError, ValueError, KeyError, IndexError):
            return False
        return bool(last["max_c"] == 93.0 and last["shedding"])

    wait_for(hot_on_disk, what="a ring flush while hot")
    guard.send_signal(signal.SIGKILL)  # no chance to write anything
    guard.wait(timeout=5)
    assert not board.p("/var/lib/alma-guard/clean-shutdown").exists()
    time.sleep(0.1)
    assert proc_state(w.pid) == "T"  # the work stays paused: the dead guard never resumes hot work

    board.set_pmc("SYS_RESET_N")
    reboot(board, "0b0e5a0c-0000-4000-8000-000000000003", children)
    code, out = guard_json(board, "resets")
    pending = out["pending"]
    assert isinstance(pending, dict)
    assert pending["ended"] == "thermal"
    assert pending["boot_id"] == "0b0e5a0c-0000-4000-8000-000000000001"
    assert pending["last_max_c"] == 93.0
    ev = " | ".join(pending["evidence"])
    assert "Tegra PMC reset_reason SYS_RESET_N, reset_level L0" in ev
    assert "no clean-shutdown marker" in ev and "shedding at the last record" in ev
    assert code == 0  # died at 93 C, above the 89 C shed threshold: the guard did its part

    # The next guard start records it for good.
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "run", "--polls", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert "ended: thermal" in r.stderr
    code, out = guard_json(board, "resets")
    assert out["pending"] is None
    boots = out["boots"]
    assert isinstance(boots, list) and boots[-1]["ended"] == "thermal"


def test_resets_warns_when_the_board_died_below_the_shed_threshold(board: FakeBoard) -> None:
    orin_zones(board, 40.0)  # shed 89 C from the 99 C trip
    lib = board.p("/var/lib/alma-guard")
    lib.mkdir(parents=True)
    (lib / "ring.json").write_text(
        json.dumps(
            {
                "schema": "alma.guard-ring/1",
                "boot_id": "previous-boot",
                "shed_c": 89.0,
                "resume_c": 79.0,
                "samples": [
                    {"t": "2026-11-30T10:00:00Z", "max_c": 84.0, "zone": "tj-thermal", "shedding": False},
                    {"t": "2026-11-30T10:00:10Z", "max_c": 86.5, "zone": "tj-thermal", "shedding": False},
                ],
            }
        )
    )
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "resets"], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "ended THERMAL" in r.stdout
    assert "the board reset at 86.5 C (tj-thermal" in r.stderr
    assert "below the shed threshold 89.0 C that was supposed to protect it" in r.stderr
    assert "measured_reset_c = 86.5" in r.stderr


def test_guard_cli_bad_config_exits_2_with_a_hint(board: FakeBoard) -> None:
    board.write_config("guard.toml", "[guard]\nslice = \n")
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "run"], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert "error:" in r.stderr and "try:" in r.stderr and "Traceback" not in r.stderr
    assert not board.p("/run/alma-guard/state.json").exists()


def test_status_reports_stale_state(board: FakeBoard) -> None:
    board.write_guard_state(age_s=120)
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "status"], capture_output=True, text=True
    )
    assert r.returncode == 1 and "STALE" in r.stdout
    board.write_guard_state(shedding=True, reason="tj-thermal 90.0 C >= shed 89.0 C")
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "status"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.startswith("SHEDDING since")


# -- the cgroup v2 freeze path ---------------------------------------------------------------


def _frozen(cg: Path) -> bool:
    return "frozen 1" in (cg / "cgroup.events").read_text()


def _size(counter: Path) -> int:
    return counter.stat().st_size if counter.exists() else 0


def _grows(counter: Path) -> bool:
    """The worker makes progress: waits for it (a loaded host may not run it for a while)."""
    before = _size(counter)
    deadline = time.monotonic() + 60.0
    while _size(counter) <= before and time.monotonic() < deadline:
        time.sleep(0.01)
    return _size(counter) > before


def _still(counter: Path, window: float = 0.3) -> bool:
    """No progress over a window (a frozen worker never makes any: this cannot fail falsely)."""
    before = _size(counter)
    time.sleep(window)
    return _size(counter) == before


def test_cgroup_freeze_path_pauses_and_thaws_real_work(
    child_cgroup: Path, board: FakeBoard, children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    counter = tmp_path / "progress"
    w = spawn_worker(children, counter)
    (child_cgroup / "cgroup.procs").write_text(str(w.pid))
    assert _grows(counter)

    orin_zones(board, 50.0)
    pauser = Pauser(child_cgroup, board.p("/run/alma-guard/paused.json"))
    t = [1000.0]
    guard = Guard(GuardConfig(holdoff_s=2.0), Paths(board.root), pauser=pauser, wall=lambda: 1.78e9 + t[0])
    board.set_temp("gpu-thermal", 92.0)
    assert guard.step(t[0]) == "shed"
    assert pauser.method == "freeze"  # not the SIGSTOP fallback
    deadline = time.monotonic() + 5
    while not _frozen(child_cgroup) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _frozen(child_cgroup)
    assert _still(counter)  # really not running
    assert proc_state(w.pid) != "T"  # frozen, not signal-stopped

    board.set_temp("gpu-thermal", 50.0)
    for _ in range(4):
        t[0] += 1.0
        guard.step(t[0])
    assert not _frozen(child_cgroup)
    assert _grows(counter)


def test_long_poll_period_still_feeds_the_systemd_watchdog(board: FakeBoard, notify: NotifySocket) -> None:
    orin_zones(board, 50.0)
    board.write_config("guard.toml", "[guard]\ninterval_s = 30.0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env.update(NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="600000")  # WatchdogSec=0.6s
    guard = subprocess.Popen(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "run"], env=env, stderr=subprocess.PIPE
    )
    try:
        notify.wait_for("READY=1")
        msgs = notify.drain(time.monotonic() + 1.5)
        assert sum(m.count("WATCHDOG=1") for m in msgs) >= 4  # every 0.2 s although a poll is 30 s
    finally:
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=10) == 0
