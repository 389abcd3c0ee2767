"""The machine signals on a fake tree: power (systemd's on-AC rule), heat, guard state,
owner presence (pts atimes set by the test, logind session files, non-grid CPU load)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from almaboard.thermal import Reading
from erangrid import power, presence, thermal
from support import wait_for


@pytest.mark.parametrize(
    ("supplies", "expected"),
    [
        ([], True),  # no power-supply class entries: a mains-only board
        ([("ADP1", "Mains", True, None)], True),
        ([("ADP1", "Mains", False, None), ("BAT0", "Battery", None, "Discharging")], False),
        ([("BAT0", "Battery", None, "Discharging")], False),
        ([("BAT0", "Battery", None, "Charging")], True),
        ([("BAT0", "Battery", None, "Full")], True),
        ([("ADP1", "Mains", True, None), ("BAT0", "Battery", None, "Discharging")], True),
        ([("usb", "USB", True, None), ("BAT0", "Battery", None, "Discharging")], True),
        ([("ADP1", "Mains", False, None)], True),  # offline mains and no battery: nothing says battery
    ],
)
def test_on_ac_follows_systemds_rule(machine, supplies, expected):
    for d in machine.ps.iterdir():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    for name, kind, online, status in supplies:
        machine.supply(name, kind, online=online, status=status)
    assert power.on_ac(machine.ps) is expected


def test_peripheral_battery_is_not_the_machines_power(machine):
    (machine.ps / "ADP1" / "online").write_text("0\n")
    machine.supply("hidpp_battery_0", "Battery", status="Discharging", scope="Device")
    assert power.on_ac(machine.ps) is True
    machine.supply("BAT0", "Battery", status="Discharging")
    assert power.on_ac(machine.ps) is False


def _temps(readings):
    return {name: r.celsius for name, r in readings.items()}


def test_zone_over_its_limit_is_hot_and_named(machine):
    watch = thermal.ZoneWatch(machine.thermal)
    zones = watch.read(0.0)
    assert _temps(zones) == {"cpu-thermal": 45.0, "tj-thermal": 50.0}
    assert not thermal.zone_heat(zones, 80.0, {}).hot
    machine.zone(1, "tj-thermal", 91.2)
    heat = thermal.zone_heat(watch.read(10.0), 80.0, {})
    assert heat.hot and heat.reason == "tj-thermal 91 °C"
    # A per-zone limit overrides the default both ways.
    assert not thermal.zone_heat(watch.read(11.0), 80.0, {"tj-thermal": 95.0}).hot
    assert thermal.zone_heat({"cpu-thermal": Reading(45.0)}, 80.0, {"cpu-thermal": 40.0}).hot


@pytest.mark.parametrize("garbage", ["garbage\n", "-273150\n", "-2147483648\n", "2147483647\n", "\n"])
def test_unreadable_or_implausible_zone_counts_as_hot(machine, garbage):
    """An impossible reading was skipped (= cool); it must hard-pause instead."""
    (machine.thermal / "thermal_zone1" / "temp").write_text(garbage)
    heat = thermal.zone_heat(thermal.ZoneWatch(machine.thermal).read(0.0), 80.0, {})
    assert heat.hot and "tj-thermal" in heat.reason and "counts as hot" in heat.reason


def test_a_jump_faster_than_physics_counts_as_hot_and_a_vanished_zone_too(machine):
    watch = thermal.ZoneWatch(machine.thermal)
    assert not thermal.zone_heat(watch.read(0.0), 80.0, {}).hot
    machine.zone(1, "tj-thermal", 0.0)  # 50 -> 0 C in half a second: a glitch, not cooling
    heat = thermal.zone_heat(watch.read(0.5), 80.0, {})
    assert heat.hot and "implausible jump" in heat.reason
    assert not thermal.zone_heat(watch.read(60.0), 80.0, {}).hot  # sustained: accepted later
    import shutil

    shutil.rmtree(machine.thermal / "thermal_zone1")
    heat = thermal.zone_heat(watch.read(61.0), 80.0, {})
    assert heat.hot and "tj-thermal vanished" in heat.reason


def test_guard_state_fresh_shedding_stale_missing(machine):
    assert not thermal.guard_heat(machine.guard, 30, True).hot
    machine.guard_state(shedding=True, reason="tj-thermal 91.2 C >= shed 85.0 C")
    heat = thermal.guard_heat(machine.guard, 30, True)
    assert heat.hot and heat.reason == "guard shedding: tj-thermal 91.2 C >= shed 85.0 C"
    machine.guard_state(shedding=False, updated=time.time() - 31)
    heat = thermal.guard_heat(machine.guard, 30, True)
    assert heat.hot and "stale" in heat.reason  # the guard may be dead: fail closed
    machine.guard.write_text("{not json")
    assert thermal.guard_heat(machine.guard, 30, True).hot
    machine.guard.write_text('{"schema": "something/2", "updated": "2026-01-01T00:00:00Z"}')
    assert "unknown schema" in thermal.guard_heat(machine.guard, 30, True).reason
    machine.guard.unlink()
    assert thermal.guard_heat(machine.guard, 30, True).reason == "thermal guard state missing"
    assert not thermal.guard_heat(machine.guard, 30, False).hot  # no guard on this machine: not required


def test_pts_atime_is_owner_activity_and_new_pts_are_seen(machine):
    now = time.time()
    dev = machine.root / "dev"
    assert presence.tty_activity(presence.terminals(dev, machine.pts, False)).at is None
    machine.touch_pts(0, now - 500)
    act = presence.tty_activity(presence.terminals(dev, machine.pts, False))
    assert act.at == pytest.approx(now - 500) and act.what == "pts/0"
    machine.touch_pts(7, now - 3)  # a new SSH login appears: the next scan sees it
    act = presence.tty_activity(presence.terminals(dev, machine.pts, False))
    assert act.at == pytest.approx(now - 3) and act.what == "pts/7"


def test_serial_ttys_ignored_by_default_virtual_consoles_counted(machine):
    dev = machine.root / "dev"
    now = time.time()
    serial = dev / "ttyTCU0"
    serial.write_text("")
    os.utime(serial, (now - 1, now - 1))
    assert presence.tty_activity(presence.terminals(dev, machine.pts, False)).at is None
    act = presence.tty_activity(presence.terminals(dev, machine.pts, True))
    assert act.what == "ttyTCU0"
    vt = dev / "tty1"
    vt.write_text("")
    os.utime(vt, (now, now))
    assert presence.tty_activity(presence.terminals(dev, machine.pts, False)).what == "tty1"


def test_logind_sessions(machine):
    now = time.time()
    (machine.sessions / "3").write_text(
        "# This is private data. Do not parse.\nUID=1000\nUSER=alice\nACTIVE=1\nSTATE=active\nREMOTE=1\n"
        f"TYPE=tty\nCLASS=user\nREALTIME={int((now - 40) * 1e6)}\n"
    )
    (machine.sessions / "3.ref").write_text("")
    (machine.sessions / "c1").write_text(
        f"CLASS=greeter\nTYPE=x11\nACTIVE=1\nSTATE=active\nREALTIME={int(now * 1e6)}\n"
    )
    act = presence.session_activity(machine.sessions, now)
    assert act.at == pytest.approx(now - 40, abs=1e-3) and act.what == "session 3"
    (machine.sessions / "5").write_text("UID=1000\nACTIVE=1\nSTATE=active\nTYPE=wayland\nCLASS=user\nREALTIME=1\n")
    act = presence.session_activity(machine.sessions, now)
    assert act.at == now and act.what == "graphical session 5"  # input unseen without input devices: present


def test_logind_session_files_are_named_by_a_session_id(machine):
    """logind writes a session file to ".#<id>XXXXXX" and renames it in: that name, half
    written or left by a crash, is not a session; nor is a name that is no session id (it
    would reach the log)."""
    now = time.time()
    (machine.sessions / "3").write_text(
        f"UID=1000\nACTIVE=1\nSTATE=active\nTYPE=tty\nCLASS=user\nREALTIME={int((now - 40) * 1e6)}\n"
    )
    graphical = "UID=1000\nACTIVE=1\nSTATE=active\nTYPE=wayland\nCLASS=user\nREALTIME=1\n"
    (machine.sessions / ".#5xY2z9a").write_text(graphical)
    (machine.sessions / "6\x1b[2J").write_text(graphical)
    act = presence.session_activity(machine.sessions, now)
    assert act.what == "session 3", act


def _burner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def _ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (proc(5): fields 14 and 15)."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def _snapshot(proc: Path, pids: list[int]) -> int:
    """The /proc files CpuLoad reads, copied at one instant (windows that read the copy see
    the same ticks, whatever the host's load did between their reads); the copy's total
    CPU ticks (proc(5): the first eight fields of the cpu line)."""
    proc.mkdir(exist_ok=True)
    stat = Path("/proc/stat").read_bytes()
    (proc / "stat").write_bytes(stat)
    for pid in pids:
        (proc / str(pid)).mkdir(exist_ok=True)
        (proc / str(pid) / "stat").write_bytes(Path(f"/proc/{pid}/stat").read_bytes())
    return sum(int(v) for v in stat.split(b"\n", 1)[0].split()[1:9])


def test_cpu_load_counts_others_but_not_the_jobs_own_group(tmp_path):
    # The effect, not a rate: on a busy host everyone's share is 1.0 and the two burners get
    # a sliver of it, so compare the ticks the kernel gave them (real /proc, copied).
    job, other = _burner(), _burner()
    proc = tmp_path / "proc"
    try:
        now = [0.0]
        blind = presence.CpuLoad(proc, window=5, clock=lambda: now[0])
        aware = presence.CpuLoad(proc, window=5, clock=lambda: now[0])
        total0 = _snapshot(proc, [job.pid, other.pid])
        job0, other0 = aware.group_ticks(job.pid), aware.group_ticks(other.pid)
        assert blind.sample(None) is None and aware.sample(job.pid) is None
        # Each burner runs for at least 20 ticks (0.2 s of CPU), however long that takes.
        wait_for(lambda: _ticks(job.pid) - job0 >= 20 and _ticks(other.pid) - other0 >= 20, what="burners' CPU")
        dtotal = _snapshot(proc, [job.pid, other.pid]) - total0
        now[0] = 1.0
        everyone, non_grid = blind.sample(None), aware.sample(job.pid)
        assert everyone is not None and non_grid is not None
        job_ticks, other_ticks = aware.group_ticks(job.pid) - job0, aware.group_ticks(other.pid) - other0
        assert job_ticks >= 20 and other_ticks >= 20
        # The aware window subtracts exactly the job group's ticks ...
        assert (everyone - non_grid) * dtotal == pytest.approx(job_ticks), (everyone, non_grid, dtotal)
        # ... and another process's load stays in the non-grid share (the kernel's per-CPU
        # and per-process tick counts differ a little: half of it is plenty).
        assert non_grid * dtotal >= other_ticks / 2, (non_grid, dtotal, other_ticks)
        assert aware.group_ticks(None) == 0
    finally:
        for p in (job, other):
            p.kill()
            p.wait()
