"""The guard's invariants under faults found by attacking it (each test failed on the old code).

(1) it never kills work; (2) it never resumes while a zone is hot, or was hot and is now
unreadable or implausible (a SIGTERM then leaves the work paused); (3) work any guard paused
is resumed by a later guard once every zone is readable and cool past the hold-off, whatever
files were lost; (4) an I/O error on its own paths is logged once, reported in STATUS= and
`alma-guard status`, and never stops the loop. Work is real child processes (/proc/PID/stat)
or the real cgroup v2 freezer; "read-only" is a real read-only bind mount.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from almaboard.paths import Paths
from almaguard.config import GUARD_DEFAULTS, GuardConfig
from almaguard.guard import Guard
from almaguard.pause import Pauser, frozen
from support import DEADLINE_S, IN_CI
from support_guard import (
    ALMA_GUARD,
    RUNNING,
    STOPPED,
    Clock,
    FakeBoard,
    ReadOnly,
    make_guard,
    orin_zones,
    proc_state,
    remove_zone,
    set_raw,
    spawn_worker,
    wait_state,
)

REPO = Path(__file__).resolve().parents[2]
# These tests wait out a short hold-off.
make_guard = functools.partial(make_guard, holdoff_s=5.0)


def run_polls(guard: Guard, clock: Clock, seconds: float, step: float = 1.0) -> list[str]:
    actions = []
    end = clock.t + seconds
    while clock.t < end:
        clock.t += step
        a = guard.step(clock.t)
        if a:
            actions.append(a)
    return actions


@pytest.fixture
def read_only_run(board: FakeBoard):
    why = ReadOnly.available()
    if why:
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    run = board.p("/run/alma-guard")
    run.mkdir(parents=True, exist_ok=True)
    ro = ReadOnly(run)
    yield ro
    ro.off()


# -- (2) the zone that caused the shed goes blind ---------------------------------------------


@pytest.mark.parametrize("whole_dir", [False, True], ids=["temp-removed", "zone-dir-removed"])
def test_the_zone_that_caused_the_shed_going_blind_never_resumes(
    board: FakeBoard, children: list[subprocess.Popen[bytes]], whole_dir: bool
) -> None:
    orin_zones(board, 50.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    guard.step(clock.t)
    board.set_temp("tj-thermal", 95.0)
    clock.t += 5.0
    assert guard.step(clock.t) == "shed"
    assert wait_state(w.pid, STOPPED) == "T"
    remove_zone(board, "tj-thermal", whole_dir)  # the others read 50 C
    assert run_polls(guard, clock, 120.0) == []  # far past the 5 s hold-off
    assert guard.status.shedding and "tj-thermal" in guard.status.unreadable
    assert proc_state(w.pid) == "T"
    guard._stop()  # what SIGTERM does: blind, so the work stays paused
    time.sleep(0.05)
    assert proc_state(w.pid) == "T"


def test_sigterm_of_the_real_guard_while_blind_leaves_work_paused(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 50.0)
    board.write_config("guard.toml", "[guard]\ninterval_s = 0.1\nholdoff_s = 0.3\n")
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    board.set_temp("tj-thermal", 95.0)
    guard = subprocess.Popen([sys.executable, str(ALMA_GUARD), "--root", str(board.root), "run"])
    try:
        assert wait_state(w.pid, STOPPED) == "T"
        remove_zone(board, "tj-thermal")
        time.sleep(1.0)  # > hold-off: the old guard resumed here
        assert proc_state(w.pid) == "T"
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(timeout=60) == 0
        time.sleep(0.1)
        assert proc_state(w.pid) == "T"  # the old guard resumed at once on SIGTERM
    finally:
        if guard.poll() is None:
            guard.kill()
            guard.wait()


# -- plausibility: impossible readings are not cool --------------------------------------------


@pytest.mark.parametrize("garbage", ["-273150\n", "-2147483648\n", "2147483647\n", "banana\n", "\n"])
def test_impossible_readings_while_shedding_never_resume(
    board: FakeBoard, children: list[subprocess.Popen[bytes]], garbage: str
) -> None:
    orin_zones(board, 95.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    assert guard.step(clock.t) == "shed"
    for kind in list(board._zones):
        set_raw(board, kind, garbage)
    assert run_polls(guard, clock, 120.0) == []
    assert proc_state(w.pid) == "T"
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert state["shedding"] is True and state["zones"] == {}  # no -2147483.6 C shown as a reading
    assert sorted(state["unreadable"]) == sorted(board._zones)


def test_an_implausible_drop_is_not_cooling_and_a_real_one_is_accepted(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 95.0)
    clock = Clock()
    guard = make_guard(board, clock, holdoff_s=5.0)
    assert guard.step(clock.t) == "shed"
    board.set_all_temps(20.0)  # 95 -> 20 C within 0.1 s: a glitching sensor, not a cooler
    clock.t += 0.1
    guard.step(clock.t)
    assert guard.status.unreadable == sorted(board._zones) and guard._cool_since is None
    # The same value, held: judged against the last accepted 95 C and the time since, it
    # becomes plausible (75 C in 2 s < 50 C/s) and the normal hold-off starts from there.
    assert run_polls(guard, clock, 10.0) == ["resume"]


# -- (4) read-only state dir: never a crash, never a SIGSTOP over a frozen group -------------


def test_read_only_state_dir_pauses_reports_and_resumes(
    board: FakeBoard, children: list[subprocess.Popen[bytes]], read_only_run: ReadOnly
) -> None:
    orin_zones(board, 50.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    sent: list[str] = []
    guard = make_guard(board, clock)
    guard.notifier.status = lambda text: sent.append(text) or True  # type: ignore[method-assign]
    guard.step(clock.t)
    read_only_run.on()
    board.set_all_temps(95.0)
    clock.t += 5.0
    assert guard.step(clock.t) == "shed"  # the old guard died here (PermissionError in _save)
    assert wait_state(w.pid, STOPPED) == "T"
    assert any("cannot write" in e and "paused.json" in e for e in guard.status.errors)
    assert any("I/O errors" in t and "paused.json" in t for t in sent)  # STATUS=
    fallback = json.loads(board.p("/var/lib/alma-guard/state.json").read_text())
    assert fallback["shedding"] is True and fallback["errors"]
    r = subprocess.run(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "status"], capture_output=True, text=True
    )
    assert "I/O ERROR" in r.stdout and "read from" in r.stdout
    board.set_all_temps(50.0)
    assert run_polls(guard, clock, 10.0) == ["resume"]
    assert wait_state(w.pid, RUNNING) in RUNNING


def test_kill_9_with_a_read_only_state_dir_and_no_record_is_recovered_from_the_machine(
    board: FakeBoard, children: list[subprocess.Popen[bytes]], read_only_run: ReadOnly
) -> None:
    orin_zones(board, 95.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    read_only_run.on()
    clock = Clock()
    guard = make_guard(board, clock)
    assert guard.step(clock.t) == "shed"
    assert wait_state(w.pid, STOPPED) == "T"
    assert not board.p("/run/alma-guard/paused.json").exists()  # nothing recorded the pause
    del guard  # kill -9: no _stop
    read_only_run.off()
    board.set_all_temps(50.0)
    clock2 = Clock()
    guard2 = make_guard(board, clock2)
    assert guard2.status.shedding and "adopted" in guard2.status.reason  # found from state T
    guard2.step(clock2.t)
    assert run_polls(guard2, clock2, 10.0) == ["resume"]
    assert wait_state(w.pid, RUNNING) in RUNNING


def test_a_restarted_guard_finds_a_frozen_cgroup_without_any_record(
    child_cgroup: Path, board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    w = spawn_worker(children)
    (child_cgroup / "cgroup.procs").write_text(str(w.pid))
    (child_cgroup / "cgroup.freeze").write_text("1")  # a guard froze it, then died with its record
    deadline = time.monotonic() + DEADLINE_S
    while not frozen(child_cgroup) and time.monotonic() < deadline:
        time.sleep(0.01)
    orin_zones(board, 50.0)
    pauser = Pauser(child_cgroup, board.p("/run/alma-guard/paused.json"))
    assert pauser.method == "freeze"
    clock = Clock()
    guard = Guard(GuardConfig(holdoff_s=2.0), Paths(board.root), pauser=pauser, wall=clock.wall)
    guard.step(clock.t)
    assert run_polls(guard, clock, 5.0) == ["resume"]
    assert (child_cgroup / "cgroup.freeze").read_text().strip() == "0"


def test_a_restarted_guard_adopts_a_sigstop_its_predecessor_sent_that_is_still_pending(
    board: FakeBoard, children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """Killed right after its SIGSTOP, with no record: the worker shows T only once it is
    scheduled, so the next guard must count the pending stop as a pause to resume."""
    w = spawn_worker(children)
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.procs").write_text(f"{w.pid}\n")
    proc = tmp_path / "proc"  # the kernel's view at that instant: runnable, SIGSTOP pending
    (proc / str(w.pid)).mkdir(parents=True)
    (proc / str(w.pid) / "stat").write_text(f"{w.pid} (python3) R 1 1 1 0 -1\n")
    (proc / str(w.pid) / "status").write_text("Name:\tpython3\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000040000\n")
    orin_zones(board, 50.0)
    pauser = Pauser(cg, board.p("/run/alma-guard/paused.json"), proc=proc)
    assert pauser.method == "sigstop" and pauser.stopped == {w.pid}
    clock = Clock()
    guard = Guard(GuardConfig(holdoff_s=2.0), Paths(board.root), pauser=pauser, wall=clock.wall)
    guard.step(clock.t)
    assert run_polls(guard, clock, 5.0) == ["resume"]


def test_a_pending_sigstop_acted_on_between_the_two_proc_reads_is_still_adopted(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker runs and stops between the restarted guard's reads of its state and of its
    pending signals: read state first, it looked runnable and then had nothing pending, and
    the stop was nobody's. Pending first: a stop not pending any more has happened (the
    kernel dequeues it and sets T under one lock), so the state read after it says T."""
    import almaguard.pause as pz

    w = spawn_worker(children)
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.procs").write_text(f"{w.pid}\n")
    proc = tmp_path / "proc"
    (proc / str(w.pid)).mkdir(parents=True)

    def view(state: str, shdpnd: str) -> None:
        (proc / str(w.pid) / "stat").write_text(f"{w.pid} (python3) {state} 1 1 1 0 -1\n")
        (proc / str(w.pid) / "status").write_text(f"Name:\tpython3\nSigPnd:\t0000000000000000\nShdPnd:\t{shdpnd}\n")

    view("R", "0000000000040000")  # SIGSTOP sent by the killed guard, not yet acted on
    real_read = pz.read_text

    def read_text(path: Path) -> str | None:
        text = real_read(path)
        if path.parent.parent == proc:
            view("T", "0000000000000000")  # the worker got the CPU right after this read
        return text

    monkeypatch.setattr(pz, "read_text", read_text)
    pauser = Pauser(cg, tmp_path / "run" / "paused.json", proc=proc)
    assert pauser.method == "sigstop" and pauser.stopped == {w.pid}


def test_read_only_state_dir_in_freeze_mode_never_sigstops_the_frozen_group(
    child_cgroup: Path, board: FakeBoard, children: list[subprocess.Popen[bytes]], read_only_run: ReadOnly
) -> None:
    w = spawn_worker(children)
    (child_cgroup / "cgroup.procs").write_text(str(w.pid))
    orin_zones(board, 50.0)
    read_only_run.on()
    pauser = Pauser(child_cgroup, board.p("/run/alma-guard/paused.json"))
    clock = Clock()
    guard = Guard(GuardConfig(holdoff_s=2.0), Paths(board.root), pauser=pauser, wall=clock.wall)
    guard.step(clock.t)
    board.set_all_temps(95.0)
    clock.t += 5.0
    assert guard.step(clock.t) == "shed"
    assert pauser.method == "freeze" and pauser.record_error
    time.sleep(0.1)
    assert proc_state(w.pid) != "T"  # frozen, not signal-stopped (the old fallback SIGSTOPped)
    board.set_all_temps(50.0)
    assert run_polls(guard, clock, 5.0) == ["resume"]
    assert not frozen(child_cgroup) and wait_state(w.pid, RUNNING) in RUNNING


# -- docs: one number for the state-file interval ---------------------------------------------


def test_docs_agree_on_the_state_file_interval() -> None:
    every = GUARD_DEFAULTS["state_every_s"]
    guard_md = " ".join((REPO / "docs/guard.md").read_text().split())
    formats_md = " ".join((REPO / "docs/formats.md").read_text().split())
    for name, text in (("docs/guard.md", guard_md), ("docs/formats.md", formats_md)):
        assert f"at least every {every:g} s" in text, name
        assert "at least every 10 s" not in text.replace("ring", ""), name
