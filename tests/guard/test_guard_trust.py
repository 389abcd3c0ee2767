"""The guard's invariants of issue 19, each attacked as a hostile tester did (each test failed
on the code before the fix): zones are keyed by sysfs path (a vanished ``soc-thermal`` whose
sibling is ``soc-thermal#1`` stays blocking), a failed thaw is retried until thawed and shown
as an error, freshness runs on CLOCK_BOOTTIME (wall-clock steps either way are harmless for
the guard, eran-grid and alma-health), SIGHUP never kills, blind is hot (tj or a majority
unreadable sheds), EMFILE is reported and survived, a stuck sensor is flagged, and a new zone
is read from its first poll. alma-health reads bounded and types its own state."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from almaboard.files import iso
from almaboard.nagios import OK, UNKNOWN, WARNING
from almaboard.paths import Paths
from almaguard import pause
from almaguard.health import HEALTH_DEFAULTS, Context, run_checks
from almaguard.pause import Pauser, frozen
from support_guard import ALMA_GUARD, Clock, FakeBoard, make_guard, orin_zones, remove_zone

REPO = Path(__file__).resolve().parents[2]


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


IDLEGRID = REPO / "tools" / "idlegrid"


# Read at import: the suite's autouse fixture clears ALMA_* from the environment per test.
MUTANT = os.environ.get("ALMA_GUARD_MUTANT", "")


@pytest.fixture(autouse=True)
def _mutant(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ALMA_GUARD_MUTANT`` (bench/mutants_guard.py) patches one rule out: these attacks
    must catch every mutant of issue 19's invariants."""
    name = MUTANT
    if name:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from test_guard_faults import apply_mutant  # type: ignore[import-not-found]

        apply_mutant(name, monkeypatch)


def polls(guard, clock: Clock, seconds: float) -> list[str]:
    out = []
    end = clock.t + seconds
    while clock.t < end:
        clock.t += 1.0
        a = guard.step(clock.t)
        if a:
            out.append(a)
    return out


# -- zones by path, never by type ----------------------------------------------------------
def test_a_vanished_zone_that_shares_its_type_stays_blocking_after_rediscovery(board: FakeBoard) -> None:
    board.add_zone("soc-thermal", 50.0, key="soc-a")
    board.add_zone("soc-thermal", 50.0, key="soc-b")
    board.add_zone("tj-thermal", 50.0)
    clock = Clock()
    g = make_guard(board, clock, holdoff_s=5.0)
    assert sorted(z.name for z in g.zones) == ["soc-thermal", "soc-thermal#1", "tj-thermal"]
    board.set_temp("soc-a", 95.0)
    assert "shed" in polls(g, clock, 3)
    remove_zone(board, "soc-a", whole_dir=True)  # the hot zone vanishes; its sibling is cool
    board.set_temp("soc-b", 40.0)
    board.set_temp("tj-thermal", 40.0)
    assert polls(g, clock, 120) == []  # four rediscoveries: still no resume
    assert g.status.shedding and "soc-thermal" in g.status.unreadable
    paths = {z.name: str(z.path) for z in g.zones}
    assert len(set(paths.values())) == 3  # no two names for one sysfs directory


def test_a_zone_that_appears_is_read_from_its_first_poll(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock)
    polls(g, clock, 2)
    board.add_zone("late-thermal", 97.0)  # probed late, already hot
    clock.t += 1.0
    assert g.step(clock.t) == "shed"


def test_a_zone_that_appears_in_a_gap_of_the_ids_is_read_from_its_first_poll(board: FakeBoard) -> None:
    """The kernel gives a new zone the lowest free id (ida_alloc), not the highest plus one:
    zones 2 and 3 gone before the guard started, a new hot zone is thermal_zone2. Probing
    only thermal_zone5 saw it at the 30 s rediscovery."""
    for kind in ("cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "tj-thermal"):
        board.add_zone(kind, 50.0)
    remove_zone(board, "cv0-thermal", whole_dir=True)
    remove_zone(board, "cv1-thermal", whole_dir=True)
    clock = Clock()
    g = make_guard(board, clock)
    assert sorted(z.path.name for z in g.zones) == ["thermal_zone0", "thermal_zone1", "thermal_zone4"]
    polls(g, clock, 2)
    board.add_zone("late-thermal", 97.0)  # a free name for the setters' bookkeeping ...
    late = board.p("/sys/class/thermal/thermal_zone2")
    board._zones["late-thermal"].rename(late)  # ... at the id the kernel really allocates
    board._zones["late-thermal"] = late
    clock.t += 1.0
    assert g.step(clock.t) == "shed"


# -- a failed thaw is retried, shown as an error ----------------------------------------------
@pytest.mark.parametrize("err", [errno.EBUSY, errno.EIO, errno.EACCES, errno.EAGAIN, errno.EINTR])
def test_a_failed_thaw_is_retried_until_thawed_and_reported_meanwhile(
    board: FakeBoard,
    child_cgroup: Path,
    children: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    err: int,
) -> None:
    w = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    children.append(w)
    (child_cgroup / "cgroup.procs").write_text(str(w.pid))
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock, holdoff_s=3.0)
    g.pauser = Pauser(child_cgroup, board.p("/run/alma-guard/paused.json"))
    real = pause._write_existing
    fails = {"n": 1}

    def flaky(path: Path, data: bytes) -> None:
        if data == b"0" and fails["n"] > 0:
            fails["n"] -= 1
            raise OSError(err, os.strerror(err))
        real(path, data)

    monkeypatch.setattr(pause, "_write_existing", flaky)
    board.set_temp("tj-thermal", 95.0)
    assert polls(g, clock, 2) == ["shed"]
    board.set_temp("tj-thermal", 88.0)
    clock.t += 1
    g.step(clock.t)
    board.set_all_temps(50.0)
    for _ in range(10):
        clock.t += 1
        if g.step(clock.t) == "resume":
            break
    assert not g.status.shedding and frozen(child_cgroup)  # the thaw failed: still frozen
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert any("could not thaw" in e for e in state["errors"]), state
    polls(g, clock, 5)  # the retry (1 s backoff) succeeds
    assert (child_cgroup / "cgroup.freeze").read_text().strip() == "0" and not frozen(child_cgroup)
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert not any("thaw" in e for e in state["errors"]) and not g.pauser.paused


# -- clocks: freshness on CLOCK_BOOTTIME -------------------------------------------------------
def test_a_wall_clock_stepped_back_does_not_stop_the_state_refresh(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock)
    polls(g, clock, 3)
    state_file = board.p("/run/alma-guard/state.json")
    base = clock.wall
    g.wall = lambda: base() - 3600.0  # NTP/RTC steps the wall clock back one hour
    polls(g, clock, 7)
    state = json.loads(state_file.read_text())
    assert state["updated"] == iso(base() - 3600.0 - 0.0) or state["updated"] <= iso(base() - 3590)
    assert state["boot_id"] == board.boot_id and isinstance(state["boottime"], float)


def _state(board: FakeBoard, *, updated: float, boottime_s: float, shedding: bool = False) -> Path:
    path = board.p("/run/alma-guard/state.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "schema": "alma.guard-state/1",
                "updated": iso(updated),
                "boot_id": board.boot_id,
                "boottime": boottime_s,
                "shedding": shedding,
                "since": iso(updated),
                "reason": "normal",
                "zones": {"tj-thermal": 50.0},
                "unreadable": [],
                "errors": [],
                "stuck": [],
            }
        )
    )
    return path


def _erangrid_thermal():  # eran-grid's thermal module, loaded as the board loads it
    if str(IDLEGRID) not in sys.path:
        sys.path.insert(0, str(IDLEGRID))
    from erangrid import thermal

    return thermal


def test_eran_grid_sees_a_dead_guard_as_stale_whatever_the_wall_clock_says(board: FakeBoard) -> None:
    grid_thermal = _erangrid_thermal()

    now_bt = boottime()
    # The guard died 10 min ago while the wall clock was 1 h ahead: its file is future-dated.
    path = _state(board, updated=time.time() + 3000, boottime_s=now_bt - 600)
    heat = grid_thermal.guard_heat(path, 30.0, True, boot=board.boot_id, now_boottime=now_bt)
    assert heat.hot and "stale" in heat.reason
    # A live guard whose file reads 1 h old because the wall clock stepped forward: fresh.
    path = _state(board, updated=time.time() - 3600, boottime_s=now_bt - 1)
    assert not grid_thermal.guard_heat(path, 30.0, True, boot=board.boot_id, now_boottime=now_bt).hot


def _health(board: FakeBoard, name: str = "thermal", **kw: float) -> tuple[str, str]:
    cfg = {k: dict(v) for k, v in HEALTH_DEFAULTS.items()}
    (check,) = run_checks(Context(paths=Paths(board.root), cfg=cfg, **kw), [name])  # type: ignore[arg-type]
    return check.status, check.summary


def test_alma_health_judges_the_guard_by_boottime_through_a_wall_clock_step(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    now_bt = boottime()
    _state(board, updated=time.time() + 3600, boottime_s=now_bt - 2)  # written before a step back
    assert _health(board, now=time.time(), boottime=now_bt)[0] == OK
    _state(board, updated=time.time() - 5, boottime_s=now_bt - 600)  # dead 10 min, wall says 5 s
    status, summary = _health(board, now=time.time(), boottime=now_bt)
    assert status == UNKNOWN and "stale" in summary


# -- SIGHUP never kills -----------------------------------------------------------------------
def test_sighup_is_ignored_not_fatal(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.Popen(
        [sys.executable, str(ALMA_GUARD), "--root", str(board.root), "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        state = board.p("/run/alma-guard/state.json")
        deadline = time.monotonic() + 30
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state.exists(), "the guard never wrote its state"
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"SIGHUP ignored" in err


# -- blind is hot --------------------------------------------------------------------------------
def test_tj_unreadable_sheds_and_alma_health_says_so(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock, boot_clock=clock.boottime)
    polls(g, clock, 2)
    board.break_sensor("tj-thermal")
    clock.t += 1
    assert g.step(clock.t) == "shed" and "critical zone" in g.status.reason
    status, summary = _health(board, boottime=clock.t)
    assert status == WARNING and "tj-thermal" in summary and "SHEDDING" in summary, (status, summary)


@pytest.mark.parametrize("now_bt", [100.0004, 100.0006, 59.9999, 3.0009])
def test_state_read_in_the_millisecond_it_was_written_is_fresh(board: FakeBoard, now_bt: float) -> None:
    """The guard stamps its state in whole milliseconds: rounded up (100.0006 -> 100.001), a
    reader in the same millisecond saw a state "dated in the future" and said the guard may be
    dead (15-35 % of CI runs)."""
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock, boot_clock=lambda: now_bt)
    g.step(clock.t)
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    assert state["boottime"] <= now_bt and now_bt - state["boottime"] < 0.001
    status, summary = _health(board, boottime=now_bt)
    assert status == OK and "guard not shedding" in summary, (status, summary)
    heat = _erangrid_thermal().guard_heat(board.p("/run/alma-guard/state.json"), 30.0, True, boot=board.boot_id,
                                          now_boottime=now_bt)  # fmt: skip
    assert not heat.hot, heat


def test_alma_health_started_before_the_guard_wrote_sees_fresh_state(board: FakeBoard) -> None:
    """A real guard and alma-health race: health starts (its other checks take a while), the
    guard rewrites its state, health reads it. The state is later than health's start, not
    from the future: health reads the clock after the file."""
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock)  # the real CLOCK_BOOTTIME, as on a board
    cfg = {k: dict(v) for k, v in HEALTH_DEFAULTS.items()}
    ctx = Context(paths=Paths(board.root), cfg=cfg)
    started = boottime()
    while boottime() - started < 0.01:  # the guard writes at least 10 ms after health started
        time.sleep(0.005)
    g.step(clock.t)
    (check,) = run_checks(ctx, ["thermal"])
    assert check.status == OK and "guard not shedding" in check.summary, (check.status, check.summary)


def test_a_majority_unreadable_sheds_although_the_rest_reads_cool(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock)
    polls(g, clock, 2)
    for kind in ("cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal"):
        board.break_sensor(kind)
    clock.t += 1
    assert g.step(clock.t) == "shed" and "5 of 9 zones unreadable" in g.status.reason


def test_one_unreadable_zone_of_nine_alerts_without_shedding(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock)
    board.break_sensor("cv1-thermal")
    assert polls(g, clock, 5) == [] and g.status.unreadable == ["cv1-thermal"]


# -- EMFILE ------------------------------------------------------------------------------------
def test_emfile_is_reported_the_guard_survives_and_keeps_its_state_writable(board: FakeBoard) -> None:
    import resource

    for i in range(300):
        board.add_zone(f"z{i}-thermal", 50.0)
    clock = Clock()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A process that already holds many descriptors (a long pytest run did): the budget must
    # count what is free, not a share of the limit (400 held + 120 free made the old budget 130).
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(400)]
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 120, hard))  # fewer fds than zones
    try:
        g = make_guard(board, clock)  # its reader budgets kept descriptors under the limit
        polls(g, clock, 3)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    state = json.loads(board.p("/run/alma-guard/state.json").read_text())
    # Kept descriptors are budgeted and the state still writes: every zone read, no shed.
    assert not g.status.unreadable and not state["shedding"], state["unreadable"][:3]
    g.reader.keep_fds = 10**6  # no budget: the fds run out now
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 120, hard))
    try:
        polls(g, clock, 2)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        g.reader.close()
        for fd in held:
            os.close(fd)
    assert g.status.shedding and any("file descriptors" in e for e in g.status.errors)


# -- stuck sensor -------------------------------------------------------------------------------
def test_a_sensor_stuck_on_one_value_is_flagged_not_paused(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock, boot_clock=clock.boottime, stuck_after_s=60.0)
    for i in range(90):
        board.set_all_temps(50.0 + (i % 3) * 0.1)
        board.set_temp("gpu-thermal", 50.0)  # never moves
        clock.t += 1
        assert g.step(clock.t) is None
    assert g.status.stuck == ["gpu-thermal"] and not g.status.shedding
    status, summary = _health(board, boottime=clock.t)
    assert status == WARNING and "stuck" in summary and "gpu-thermal" in summary


# -- alma-health: bounded reads, typed own state -----------------------------------------------
def test_a_huge_fake_meminfo_is_read_bounded(board: FakeBoard) -> None:
    big = board.p("/proc/meminfo")
    big.parent.mkdir(parents=True, exist_ok=True)
    with open(big, "wb") as fh:
        fh.write(b"MemTotal: 32000000 kB\nMemAvailable: 20000000 kB\n")
        fh.write(b"X" * (64 << 20))  # 64 MiB of junk on one line
    import tracemalloc

    tracemalloc.start()
    try:
        status, _summary = _health(board, "memory")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the old reader held the whole file, twice (bytes, then str)
    assert status == OK


def test_own_state_with_wrong_types_is_reset_with_one_warning(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    board.add_iface("eth0", multicast=100, rx_packets=10_000, speed=1000)
    state = board.p("/var/lib/alma-health/state.json")
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"snapshots": [{"t": "yesterday", "ifaces": 7}], "kmsg": {"seq": "x"}}))
    first, summary = _health(board, "storm")
    assert first == WARNING and "own state reset" in summary
    second, summary = _health(board, "storm")
    assert second == OK, summary
