"""The guard's decisions, driven poll by poll with an injected clock over a fake sysfs tree.

The work is REAL: child processes listed in the fake slice's cgroup.procs (no
cgroup.freeze there, so the SIGSTOP path runs) and checked in /proc/PID/stat.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest
from almaboard.errors import ConfigError as GuardError
from almaboard.thermal import Zone, discover
from almaguard.config import GuardConfig, load_guard_config
from almaguard.pause import Pauser, slice_path
from support_guard import (
    ORIN_ZONES,
    RUNNING,
    STOPPED,
    Clock,
    FakeBoard,
    make_guard,
    orin_zones,
    proc_state,
    spawn_worker,
    wait_state,
)


def test_sheds_within_one_poll_of_crossing_and_stops_real_processes(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 70.0)
    workers = [spawn_worker(children), spawn_worker(children)]
    board.set_slice_pids([w.pid for w in workers])
    clock = Clock()
    guard = make_guard(board, clock)
    assert guard.thresholds["tj-thermal"].shed_c == 89.0  # 99 C passive trip - 10

    crossed_at = None
    shed_at = None
    for i in range(40):  # a ramp of 1 C per 1 s poll on the junction sensor only
        temp = 70.0 + i
        board.set_temp("tj-thermal", temp)
        if crossed_at is None and temp >= 89.0:
            crossed_at = clock.t
        if guard.step(clock.t) == "shed":
            shed_at = clock.t
            break
        assert all(wait_state(w.pid, RUNNING, 0.5) in RUNNING for w in workers)
        clock.t += 1.0
    assert crossed_at is not None and shed_at == crossed_at  # the very poll that saw it
    assert all(wait_state(w.pid, STOPPED) == "T" for w in workers)
    assert guard.status.reason == "tj-thermal 89.0 C >= shed 89.0 C"
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert state["shedding"] is True and state["zones"]["tj-thermal"] == 89.0


def test_no_resume_before_holdoff_then_resumes(board: FakeBoard, children: list[subprocess.Popen[bytes]]) -> None:
    orin_zones(board, 95.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock, holdoff_s=30.0)
    assert guard.step(clock.t) == "shed"
    assert wait_state(w.pid, STOPPED) == "T"

    board.set_all_temps(60.0)  # well below resume (79 C)
    cool_start = clock.t + 1.0
    actions = []
    for _ in range(40):
        clock.t += 1.0
        act = guard.step(clock.t)
        actions.append((clock.t - cool_start, act))
        if act == "resume":
            break
        assert proc_state(w.pid) == "T", f"resumed early at {clock.t - cool_start} s"
    assert actions[-1] == (30.0, "resume")  # exactly when the hold-off has passed
    assert wait_state(w.pid, RUNNING) in RUNNING


def test_a_warm_blip_during_holdoff_restarts_it(board: FakeBoard, children: list[subprocess.Popen[bytes]]) -> None:
    orin_zones(board, 95.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock, holdoff_s=10.0)
    guard.step(clock.t)
    board.set_all_temps(70.0)
    for _ in range(8):
        clock.t += 1.0
        assert guard.step(clock.t) is None
    board.set_temp("gpu-thermal", 80.0)  # above resume 79: not cool enough
    clock.t += 1.0
    assert guard.step(clock.t) is None
    board.set_temp("gpu-thermal", 70.0)
    results = []
    for _ in range(12):
        clock.t += 1.0
        results.append(guard.step(clock.t))
    assert results.index("resume") == 10  # a full new hold-off, counted from the blip's end


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_flapping_under_2c_noise(board: FakeBoard, children: list[subprocess.Popen[bytes]], seed: int) -> None:
    orin_zones(board, 50.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock, holdoff_s=20.0)
    rng = random.Random(seed)
    # 5 minutes hovering on the shed threshold, then 5 minutes hovering on the resume one.
    for centre in (89.0, 79.0):
        for _ in range(300):
            for z in ORIN_ZONES:
                board.set_temp(z, centre + rng.uniform(-2.0, 2.0))
            guard.step(clock.t)
            clock.t += 1.0
    kinds = [k for _t, k, _r in guard.transitions]
    assert kinds[0] == "shed"
    assert kinds.count("shed") == 1  # never re-shed after a resume at ~79 C
    assert kinds.count("resume") <= 1  # noise above 79 keeps resetting the hold-off
    # and the ordinary case: no noise-driven resume at the shed point
    assert all(t >= 300 + Clock.START for t, k, _r in guard.transitions if k == "resume")


def test_fail_closed_when_no_sensor_is_readable(board: FakeBoard, children: list[subprocess.Popen[bytes]]) -> None:
    orin_zones(board, 40.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    assert guard.step(clock.t) is None
    for z in ORIN_ZONES:
        board.break_sensor(z)
    clock.t += 1.0
    assert guard.step(clock.t) == "shed"
    assert "no thermal sensor readable (fail closed)" in guard.status.reason
    assert wait_state(w.pid, STOPPED) == "T"
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert state["unreadable"] == sorted(ORIN_ZONES) and state["zones"] == {}
    # blind for ever: never resumes, whatever the hold-off
    for _ in range(100):
        clock.t += 1.0
        assert guard.step(clock.t) is None
    assert proc_state(w.pid) == "T"


def test_one_unreadable_sensor_alerts_but_does_not_shed(
    board: FakeBoard, caplog: pytest.LogCaptureFixture, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 40.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    board.break_sensor("cv1-thermal")
    with caplog.at_level("WARNING"):
        assert guard.step(clock.t) is None
    assert "sensor(s) unreadable: cv1-thermal" in caplog.text
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert state["unreadable"] == ["cv1-thermal"] and state["shedding"] is False
    assert wait_state(w.pid, RUNNING) in RUNNING
    # the sensor recovers: the state says so at once (not only at the next periodic write)
    board.set_temp("cv1-thermal", 41.0)
    clock.t += 1.0
    guard.step(clock.t)
    assert json.loads(board.p("/run/alma-guard/state.json").read_text())["unreadable"] == []


def test_no_thermal_zone_at_all_sheds(board: FakeBoard, children: list[subprocess.Popen[bytes]]) -> None:
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    assert guard.step(clock.t) == "shed"
    assert guard.status.reason == "no thermal zone found (fail closed)"
    assert wait_state(w.pid, STOPPED) == "T"


def test_state_file_is_exactly_the_documented_format(board: FakeBoard) -> None:
    orin_zones(board, 61.54)
    clock = Clock()
    guard = make_guard(board, clock)
    guard.step(clock.t)
    state_dir = board.p("/run/alma-guard")
    state = json.loads((state_dir / "state.json").read_text())
    assert set(state) == {
        "schema",
        "updated",
        "boot_id",
        "boottime",
        "shedding",
        "since",
        "reason",
        "zones",
        "unreadable",
        "errors",
        "stuck",
    }
    assert state["errors"] == []
    assert state["schema"] == "alma.guard-state/1"
    assert state["updated"].endswith("Z") and state["zones"]["tj-thermal"] == 61.5
    assert [p.name for p in state_dir.iterdir() if p.name.startswith(".")] == []  # no temp files left
    # rewritten at least every state_every_s even when nothing changes
    first = state["updated"]
    clock.t += 6.0
    guard.step(clock.t)
    assert json.loads((state_dir / "state.json").read_text())["updated"] != first


def test_work_that_appears_while_shedding_is_paused_too(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 95.0)
    first = spawn_worker(children)
    board.set_slice_pids([first.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    guard.step(clock.t)
    late = spawn_worker(children)
    board.set_slice_pids([first.pid, late.pid])
    clock.t += 1.0
    guard.step(clock.t)
    assert wait_state(late.pid, STOPPED) == "T"
    board.set_all_temps(50.0)
    for _ in range(40):
        clock.t += 1.0
        guard.step(clock.t)
    assert wait_state(first.pid, RUNNING) in RUNNING and wait_state(late.pid, RUNNING) in RUNNING


def test_a_restarted_guard_adopts_the_pause_it_left(board: FakeBoard, children: list[subprocess.Popen[bytes]]) -> None:
    orin_zones(board, 95.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    make_guard(board, clock).step(clock.t)  # this guard "dies" without resuming
    assert wait_state(w.pid, STOPPED) == "T"
    board.set_all_temps(50.0)
    guard = make_guard(board, clock, holdoff_s=5.0)
    assert guard.status.shedding and "adopted" in guard.status.reason
    for _ in range(10):
        clock.t += 1.0
        guard.step(clock.t)
    assert wait_state(w.pid, RUNNING) in RUNNING  # it is the new guard that continued the work


def test_stopping_hot_leaves_work_paused_stopping_cool_resumes(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    orin_zones(board, 95.0)
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    clock = Clock()
    guard = make_guard(board, clock)
    guard.step(clock.t)
    assert wait_state(w.pid, STOPPED) == "T"
    guard._stop()
    time.sleep(0.05)
    assert proc_state(w.pid) == "T"  # resuming hot work with nobody watching kills boards
    guard2 = make_guard(board, clock)
    board.set_all_temps(80.0)  # below shed 89, above resume 79
    guard2.step(clock.t)
    guard2._stop()
    assert wait_state(w.pid, RUNNING) in RUNNING


def test_thresholds_come_from_the_throttle_trip_or_the_measured_reset(board: FakeBoard, tmp_path: Path) -> None:
    board.add_zone("tj-thermal", 40.0)  # trips 99 passive, 104.5 critical, 70 passive (hot surface)
    board.add_zone("bare-thermal", 40.0, trips=())
    zones = {z.name: z for z in discover(board.p("/sys/class/thermal"))}
    assert zones["tj-thermal"].throttle_trip_c == 99.0  # not the 70 C hot-surface alert
    assert zones["tj-thermal"].critical_trip_c == 104.5

    cfg = GuardConfig()
    assert cfg.thresholds(zones["tj-thermal"]).shed_c == 89.0
    assert cfg.thresholds(zones["bare-thermal"]).shed_c == 85.0  # fallback_shed_c

    conf = tmp_path / "guard.toml"
    conf.write_text("[guard]\nmargin_c = 5.0\n")
    dropins = tmp_path / "guard.d"
    dropins.mkdir()
    (dropins / "50-board.toml").write_text('[guard]\nmeasured_reset_c = 90.0\n[zones."bare-thermal"]\nshed_c = 70.0\n')
    cfg = load_guard_config(conf)
    th = cfg.thresholds(zones["tj-thermal"])
    assert (th.shed_c, th.resume_c) == (85.0, 75.0)
    assert th.source == "measured reset 90.0 C - margin 5.0"
    assert cfg.thresholds(zones["bare-thermal"]).shed_c == 70.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[guard\n", "guard.toml"),
        ("[guard]\ninterval = 2\n", "unknown key(s) in [guard]: interval"),
        ('[guard]\nmargin_c = "ten"\n', "guard.margin_c: must be a number, not a string"),
        ("[guard]\ninterval_s = 0\n", "guard.interval_s: 0 is out of range (must be > 0"),
        ('[zones."tj-thermal"]\nshed = 80\n', "unknown key(s) in [zones.tj-thermal]: shed"),
        ("guard = 3\n", "guard: must be a table"),
        ("a = " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply"),  # RecursionError, not a crash
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    conf = tmp_path / "guard.toml"
    conf.write_text(text)
    with pytest.raises(GuardError) as err:
        load_guard_config(conf)
    assert needle in err.value.message
    assert err.value.hint


# Each of these was accepted before the typed reader: a NaN threshold compares false with
# every temperature, so the guard said "shed nan C" and never shed (or never resumed).
@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("[guard]\nslice = 'alma-work.slice'\nmargin_c = nan\n", 3, "guard.margin_c"),
        ("[guard]\nmeasured_reset_c = nan\n", 2, "guard.measured_reset_c"),
        ('[guard]\nmargin_c = 5.0\n\n[zones."tj-thermal"]\nshed_c = nan\n', 5, "zones.tj-thermal.shed_c"),
        ("[guard]\nhysteresis_c = nan\n", 2, "guard.hysteresis_c"),
        ("[guard]\ninterval_s = inf\n", 2, "guard.interval_s"),
        ("[guard]\n# polls\nstate_every_s = nan\n", 3, "guard.state_every_s"),
        ("[guard]\nstuck_after_s = -1\n", 2, "guard.stuck_after_s"),
        ("[guard]\nunreadable_shed_share = true\n", 2, "guard.unreadable_shed_share"),
        ("[guard]\nholdoff_s = 1e300\n", 2, "guard.holdoff_s"),
    ],
)
def test_non_finite_negative_or_huge_values_are_refused_at_their_line(
    tmp_path: Path, text: str, line: int, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from almaguard.cli_guard import main

    conf = tmp_path / "guard.toml"
    conf.write_text(text)
    with pytest.raises(GuardError) as err:
        load_guard_config(conf)
    assert err.value.message.startswith(f"{conf}:{line}: {key}: ")
    assert err.value.hint
    # the CLI: a configuration error (exit 2) naming file:line, never a traceback
    assert main(["--root", str(tmp_path), "--config", str(conf), "thresholds"]) == 2
    assert f"alma-guard: error: {conf}:{line}: {key}: " in capsys.readouterr().err


def test_resume_above_shed_is_refused() -> None:
    cfg = GuardConfig(zones={"tj-thermal": {"shed_c": 80.0, "resume_c": 85.0}})
    with pytest.raises(GuardError, match="resume_c 85.0 must be below shed_c 80.0"):
        cfg.thresholds(Zone("tj-thermal", Path("/nonexistent")))


def test_slice_paths_follow_systemd_nesting(tmp_path: Path) -> None:
    assert slice_path(tmp_path, "alma-work.slice") == tmp_path / "alma.slice" / "alma-work.slice"
    assert slice_path(tmp_path, "a-b-c.slice") == tmp_path / "a.slice/a-b.slice/a-b-c.slice"
    assert slice_path(tmp_path, "work.slice") == tmp_path / "work.slice"
    assert slice_path(tmp_path, "/custom/group") == tmp_path / "custom/group"
    # a hybrid v1/v2 system keeps the v2 hierarchy under unified/
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("cpu io memory pids\n")
    assert slice_path(tmp_path, "alma-work.slice") == tmp_path / "unified/alma.slice/alma-work.slice"
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")  # unified at the top wins
    assert slice_path(tmp_path, "alma-work.slice") == tmp_path / "alma.slice/alma-work.slice"


def test_pauser_with_no_slice_yet_pauses_it_when_it_appears(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    cg = board.p("/sys/fs/cgroup/alma.slice/alma-work.slice")
    pauser = Pauser(cg, board.p("/run/alma-guard/paused.json"))
    res = pauser.pause()
    assert res.method == "none" and "does not exist" in res.detail
    w = spawn_worker(children)
    board.set_slice_pids([w.pid])
    refreshed = pauser.refresh()
    assert refreshed is not None and refreshed.method == "sigstop"
    assert wait_state(w.pid, STOPPED) == "T"
    pauser.resume()
    assert wait_state(w.pid, RUNNING) in RUNNING
    assert not board.p("/run/alma-guard/paused.json").exists()


def test_a_process_stopped_by_someone_else_is_left_stopped(
    board: FakeBoard, children: list[subprocess.Popen[bytes]]
) -> None:
    import os
    import signal

    orin_zones(board, 50.0)
    ours, theirs = spawn_worker(children), spawn_worker(children)
    board.set_slice_pids([ours.pid, theirs.pid])
    clock = Clock()
    guard = make_guard(board, clock, holdoff_s=1.0)
    guard.step(clock.t)
    # Stopped while this guard watches (its owner pressed Ctrl-Z): not the guard's pause. (A
    # process found stopped when a guard STARTS is taken as a pause a previous guard left.)
    os.kill(theirs.pid, signal.SIGSTOP)
    assert wait_state(theirs.pid, STOPPED) == "T"
    board.set_all_temps(95.0)
    clock.t += 5.0
    guard.step(clock.t)
    assert wait_state(ours.pid, STOPPED) == "T"
    board.set_all_temps(50.0)
    for _ in range(3):
        clock.t += 1.0
        guard.step(clock.t)
    assert wait_state(ours.pid, RUNNING) in RUNNING
    time.sleep(0.05)
    assert proc_state(theirs.pid) == "T"  # the guard continues only what it stopped
