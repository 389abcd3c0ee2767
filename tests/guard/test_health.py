"""alma-health over fake trees: each check, the worst-of ordering, the Nagios line and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from almaboard.nagios import CODES, CRITICAL, OK, UNKNOWN, WARNING, Check, Perf, status_line, worst
from almaboard.paths import Paths
from almaguard.health import CHECK_NAMES, HEALTH_DEFAULTS, Context, run_checks
from support_guard import ALMA_HEALTH, FakeBoard, orin_zones


def ctx(board: FakeBoard, now: float, **over: dict[str, object]) -> Context:
    cfg = {k: dict(v) for k, v in HEALTH_DEFAULTS.items()}
    for k, v in over.items():
        cfg[k].update(v)
    return Context(paths=Paths(board.root), cfg=cfg, now=now)


def one(board: FakeBoard, name: str, now: float | None = None, **over: dict[str, object]) -> Check:
    (result,) = run_checks(ctx(board, time.time() if now is None else now, **over), [name])
    return result


def healthy(board: FakeBoard) -> None:
    orin_zones(board, 55.0)
    board.add_iface("eth0", multicast=100, rx_packets=10_000, speed=1000)
    board.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
    board.set_psi(0.5, 0.0)
    board.write_guard_state()
    board.add_kmsg("Booting Linux on physical CPU 0x0000000000 [0x410fd421]", prio=5)


def run_cli(board: FakeBoard, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ALMA_HEALTH), "--root", str(board.root), *args], capture_output=True, text=True, timeout=30
    )


# -- worst-of and the output formats ---------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "overall"),
    [
        ([OK, OK], OK),
        ([OK, UNKNOWN], UNKNOWN),
        ([UNKNOWN, WARNING], WARNING),  # 1 beats 3: not the numeric maximum
        ([WARNING, CRITICAL, UNKNOWN], CRITICAL),
        ([], OK),
    ],
)
def test_worst_of_ordering(states: list[str], overall: str) -> None:
    assert worst(states) == overall


def test_perfdata_and_status_line_follow_the_plugin_format() -> None:
    checks = [
        Check("storm", OK, "eth1 quiet", [Perf("eth1_mcast_rate", 3.0, "", 1000, 10000, 0)]),
        Check("memory", WARNING, "MemAvailable 8%", [Perf("mem_available_pct", 8.0, "%", 10, 5, 0, 100, low=True)]),
        Check("thermal", UNKNOWN, "guard state stale"),
    ]
    line = status_line(checks).splitlines()
    assert line[0] == (
        "ALMA-HEALTH WARNING - memory WARNING: MemAvailable 8%; thermal UNKNOWN: guard state stale"
        " | 'eth1_mcast_rate'=3;1000;10000;0; 'mem_available_pct'=8%;10:;5:;0;100"
    )
    assert line[1:] == ["storm OK: eth1 quiet", "memory WARNING: MemAvailable 8%", "thermal UNKNOWN: guard state stale"]


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("healthy", 0),
        ("stale_guard", 3),  # UNKNOWN alone
        ("stale_guard_and_low_memory", 1),  # UNKNOWN + WARNING -> WARNING (exit 1)
        ("link_down_and_stale", 2),  # CRITICAL wins
    ],
)
def test_exit_code_is_the_worst_check(board: FakeBoard, setup: str, code: int) -> None:
    healthy(board)
    if "stale" in setup:
        board.write_guard_state(age_s=300)
    if "low_memory" in setup:
        board.set_meminfo(total_kb=32_000_000, avail_kb=2_500_000)  # 7.8 %
    if "link_down" in setup:
        board.write_config("health.toml", "[links.expected]\neth0 = 1000\n")
        board.add_iface("eth0", carrier=0)
    r = run_cli(board, "--json")
    assert r.returncode == code, r.stdout
    rep = json.loads(r.stdout)
    assert rep["code"] == code and CODES[rep["status"]] == code
    assert rep["schema"] == "alma.health/1" and rep["node"] == "alma-orin-1"
    assert [c["name"] for c in rep["checks"]] == [*CHECK_NAMES]
    assert CHECK_NAMES[:7] == ("storm", "memory", "gpu", "thermal", "links", "watchdog", "disk")
    line = run_cli(board)
    assert line.returncode == code and line.stdout.startswith(f"ALMA-HEALTH {rep['status']} - ")


# Accepted before the typed reader: a NaN limit compares false, so the check never alerts.
@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("[memory]\navail_warn_pct = 10.0\navail_crit_pct = nan\n", 3, "memory.avail_crit_pct"),
        ("[thermal]\nstale_s = -1\n", 2, "thermal.stale_s"),
        ("[watchdog]\nrequired = 1\n", 2, "watchdog.required"),
        ('[links.expected]\neth0 = 1000\neth1 = "fast"\n', 3, "links.expected.eth1: must be an integer"),
    ],
)
def test_bad_config_values_are_unknown_naming_file_and_line(board: FakeBoard, text: str, line: int, key: str) -> None:
    healthy(board)
    conf = board.write_config("health.toml", text)
    r = run_cli(board)
    assert r.returncode == 3, r.stdout
    assert f"{conf}:{line}: {key}" in r.stdout
    assert "Traceback" not in r.stderr


def test_bad_config_is_unknown_with_a_hint(board: FakeBoard) -> None:
    healthy(board)
    board.write_config("health.toml", "[storm]\nmcast_wrn = 5\n")
    r = run_cli(board)
    assert r.returncode == 3
    assert "unknown key(s) in [storm]: mcast_wrn" in r.stdout and "try:" in r.stdout
    assert "Traceback" not in r.stderr
    rj = run_cli(board, "--json")
    assert rj.returncode == 3
    err = json.loads(rj.stdout)
    assert err["status"] == "UNKNOWN" and err["code"] == 3 and "mcast_wrn" in err["error"]
    r = run_cli(board, "--bogus")
    assert r.returncode == 3


# -- storm -------------------------------------------------------------------------------------


def test_storm_detected_on_synthetic_counters(board: FakeBoard) -> None:
    board.add_iface("eth1", multicast=1_000, rx_packets=50_000)
    board.add_iface("eth2", multicast=0, rx_packets=0)
    t0 = 1.78e9
    first = one(board, "storm", t0)
    assert first.status == OK and "baseline recorded for 2" in first.summary
    # quiet minute: 2 multicast/s
    board.set_counters("eth1", 1_120, 56_000)
    assert one(board, "storm", t0 + 60).status == OK
    # the bridged-loop storm: 15 000 multicast/s on eth1
    board.set_counters("eth1", 1_120 + 900_000, 56_000 + 960_000)
    storm = one(board, "storm", t0 + 120)
    assert storm.status == CRITICAL
    assert "eth1 multicast 15000/s (short)" in storm.summary and "STORM" in storm.summary
    perf = {p.label: p for p in storm.perfdata}
    assert perf["eth1_mcast_rate"].value == 15000.0 and perf["eth1_mcast_rate"].crit == 10000.0


def test_storm_surge_short_vs_long_window(board: FakeBoard) -> None:
    board.add_iface("eth1", multicast=0, rx_packets=0)
    t = 1.78e9
    one(board, "storm", t)
    total = 0
    for _ in range(10):  # ten quiet minutes at 5/s
        t += 60
        total += 300
        board.set_counters("eth1", total, total * 10)
        assert one(board, "storm", t).status == OK
    t += 60
    total += 60 * 400  # 400/s: below the absolute warning (1000/s) but 80x the long window
    board.set_counters("eth1", total, total * 10)
    surge = one(board, "storm", t)
    assert surge.status == WARNING and "surge" in surge.summary


def test_counter_going_backwards_is_a_reset_not_a_storm(board: FakeBoard) -> None:
    board.add_iface("eth1", multicast=5_000_000, rx_packets=9_000_000)
    one(board, "storm", 1.78e9)
    board.set_counters("eth1", 10, 20)  # driver reloaded
    c = one(board, "storm", 1.78e9 + 60)
    assert c.status == OK and "eth1 counters reset" in c.summary


def test_snapshots_of_another_boot_are_not_compared(board: FakeBoard) -> None:
    board.add_iface("eth1", multicast=5_000_000)
    one(board, "storm", 1.78e9)
    board.set_boot_id("another-boot")
    board.set_counters("eth1", 9_000_000, 0)
    assert "baseline recorded" in one(board, "storm", 1.78e9 + 60).summary


# -- memory ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("avail_kb", "some", "full", "status"),
    [
        (20_000_000, 0.0, 0.0, OK),
        (3_000_000, 0.0, 0.0, WARNING),  # 9.4 %
        (1_000_000, 0.0, 0.0, CRITICAL),  # 3.1 %
        (20_000_000, 35.0, 0.0, WARNING),  # PSI some
        (20_000_000, 40.0, 15.0, CRITICAL),  # PSI full
    ],
)
def test_memory(board: FakeBoard, avail_kb: int, some: float, full: float, status: str) -> None:
    board.set_meminfo(total_kb=32_000_000, avail_kb=avail_kb)
    board.set_psi(some, full)
    c = one(board, "memory")
    assert c.status == status
    assert "shared CPU+GPU" in c.summary


def test_memory_without_psi_says_so(board: FakeBoard) -> None:
    board.set_meminfo(total_kb=8_000_000, avail_kb=4_000_000)
    c = one(board, "memory")
    assert c.status == OK and "PSI not available" in c.summary


# -- gpu ---------------------------------------------------------------------------------------


def test_gpu_faults_since_last_run(board: FakeBoard) -> None:
    board.add_kmsg("usb 1-1: new high-speed USB device", prio=6)
    assert one(board, "gpu").status == OK
    board.add_kmsg("nvgpu: 17000000.gpu ga10b_gr_intr_check_gr_mme_fe1_exception:246 [ERR]  mme_fe1 exception")
    board.add_kmsg("nvgpu: 17000000.gpu nvgpu_set_err_notifier_locked:143  [ERR]  error notifier set to 13")
    c = one(board, "gpu")
    assert c.status == WARNING and "2 nvgpu error line(s)" in c.summary and "since the last run" in c.summary
    assert one(board, "gpu").status == OK  # already reported: the cursor moved on
    board.add_kmsg("NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus.")
    c = one(board, "gpu")
    assert c.status == CRITICAL and "Xid 79, fatal" in c.summary
    board.add_kmsg("NVRM: Xid (PCI:0000:01:00): 13, pid=99, Graphics Exception")
    assert one(board, "gpu").status == WARNING


def test_gpu_kernel_log_unreadable_is_unknown(board: FakeBoard) -> None:
    board.p("/dev/kmsg").unlink()
    c = one(board, "gpu")
    assert c.status == UNKNOWN and "no kernel log" in c.summary


# -- thermal -----------------------------------------------------------------------------------


def test_thermal_reports_the_guard(board: FakeBoard) -> None:
    orin_zones(board, 60.0)
    board.p("/run/alma-guard/state.json").unlink(missing_ok=True)
    c = one(board, "thermal")
    assert c.status == UNKNOWN and "is alma-guard running?" in c.summary
    board.write_guard_state(age_s=45)
    c = one(board, "thermal")
    assert c.status == UNKNOWN and "stale" in c.summary and "the guard may be dead" in c.summary
    board.write_guard_state(age_s=-3600)
    assert "the clock jumped" in one(board, "thermal").summary
    board.write_guard_state(shedding=True, reason="tj-thermal 90.1 C >= shed 89.0 C")
    c = one(board, "thermal")
    assert c.status == WARNING and "SHEDDING" in c.summary and "tj-thermal 90.1 C" in c.summary
    board.write_guard_state(unreadable=["cv2-thermal"])
    assert one(board, "thermal").status == WARNING
    board.write_guard_state()
    c = one(board, "thermal")
    assert c.status == OK and "hottest" in c.summary
    perf = {p.label: p for p in c.perfdata}
    # The published crit is where the check goes CRITICAL (trip 104.5 - 5 C), not the trip;
    # no temperature warns by itself (the guard's shedding does), so no warn is published.
    assert perf["temp_tj-thermal"].warn is None and perf["temp_tj-thermal"].crit == 99.5
    board.set_temp("tj-thermal", 99.5)  # exactly at the published threshold: still OK
    assert one(board, "thermal").status == OK
    board.set_temp("tj-thermal", 99.6)
    assert one(board, "thermal").status == CRITICAL


# -- links -------------------------------------------------------------------------------------


FABRIC = """[[link]]
a = "alma-orin-1:eth1"
b = "alma-orin-2:eth1"
subnet = "10.77.0.0/31"
speed = 10000

[[link]]
a = "alma-orin-1:eth2"
b = "alma-orin-3:eth1"
subnet = "10.77.0.2/31"
speed = 10000
"""


def test_links_carrier_and_speed_against_the_fabric(board: FakeBoard) -> None:
    board.write_config("fabric.toml", FABRIC)
    board.add_iface("eth1", carrier=1, speed=10000)
    board.add_iface("eth2", carrier=1, speed=10000)
    c = one(board, "links")
    assert c.status == OK and "eth1 up at 10000 Mb/s" in c.summary and "node alma-orin-1" in c.summary
    board.add_iface("eth2", carrier=1, speed=1000)
    c = one(board, "links")
    assert c.status == WARNING and "eth2 up at 1000 Mb/s, expected 10000 Mb/s" in c.summary
    board.add_iface("eth2", carrier=0, speed=None, operstate="down")
    assert one(board, "links").status == CRITICAL
    board.add_iface("eth2", carrier=None, speed=None, operstate="down")
    assert "administratively down" in one(board, "links").summary


def test_a_vanished_nic_is_critical_and_not_called_absent_hardware(board: FakeBoard) -> None:
    board.write_config("fabric.toml", FABRIC)
    board.add_iface("eth1", carrier=1, speed=10000)
    c = one(board, "links")
    assert c.status == CRITICAL
    assert "eth2 absent" in c.summary and "can power down and leave the bus" in c.summary


def test_links_from_health_config_and_none_configured(board: FakeBoard) -> None:
    c = one(board, "links")
    assert c.status == OK and "no fabric links configured" in c.summary
    board.add_iface("enp1s0", carrier=1, speed=2500)
    c = one(board, "links", links={"expected": {"enp1s0": 2500}})
    assert c.status == OK and "enp1s0 up at 2500" in c.summary


# -- watchdog and disk -------------------------------------------------------------------------


def test_watchdog_absent_is_said_plainly(board: FakeBoard) -> None:
    c = one(board, "watchdog")
    assert c.status == OK and "no hardware watchdog device" in c.summary and "R36" in c.summary
    assert one(board, "watchdog", watchdog={"required": True}).status == CRITICAL


def test_watchdog_present_reports_timeout_and_armed_state(board: FakeBoard) -> None:
    board.add_watchdog(identity="Tegra WDT", timeout=120, state="active")
    c = one(board, "watchdog")
    assert c.status == OK and "/dev/watchdog0 (Tegra WDT) timeout 120 s, active" in c.summary
    assert c.perfdata[0].render() == "'watchdog0_timeout'=120s;;;0;"
    board.add_watchdog(state="inactive")
    assert one(board, "watchdog").status == WARNING


def test_disk_thresholds(board: FakeBoard) -> None:
    c = one(board, "disk")
    assert c.status in (OK, WARNING, CRITICAL) and "GiB free" in c.summary
    pct = c.perfdata[0].value
    assert one(board, "disk", disk={"warn_pct": pct + 1, "crit_pct": 0.0}).status == WARNING
    assert one(board, "disk", disk={"warn_pct": 100.0, "crit_pct": pct + 1}).status == CRITICAL
    missing = one(board, "disk", disk={"paths": ["/no/such/mount"]})
    assert missing.status == UNKNOWN


def test_state_not_saved_is_said(board: FakeBoard, tmp_path: Path) -> None:
    board.add_iface("eth1")
    board.p("/var/lib").mkdir(parents=True, exist_ok=True)
    board.p("/var/lib/alma-health").write_text("not a directory")
    c = one(board, "storm")
    assert "state not saved" in c.summary


@pytest.mark.slow
def test_a_huge_kernel_log_file_is_streamed_in_bounded_memory(board: FakeBoard) -> None:
    """A 173 MB kmsg file was read whole (458 MB RSS). Streamed, RSS stays small."""
    healthy(board)
    line = "6,{seq},{seq}000,-;usb 1-1: " + "x" * 150 + "\n SUBSYSTEM=usb\n"
    with board.p("/dev/kmsg").open("w") as fh:
        chunk = []
        for seq in range(1, 400_001):  # ~70 MB
            chunk.append(line.format(seq=seq))
            if len(chunk) == 10_000:
                fh.write("".join(chunk))
                chunk.clear()
        fh.write("3,400001,400001000,-;nvgpu: 17000000.gpu gk20a_fifo_handle_pbdma_intr:1234 [ERR]  pbdma fault\n")
    size_mb = board.p("/dev/kmsg").stat().st_size / 2**20
    assert size_mb > 60
    probe = (
        "import json, resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(json.dumps({'rc': r.returncode, 'out': r.stdout,"
        " 'rss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
    )
    cmd = [sys.executable, str(ALMA_HEALTH), "--root", str(board.root), "--check", "gpu", "--json"]
    res = json.loads(subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                                    timeout=300).stdout)  # fmt: skip
    report = json.loads(res["out"])
    assert report["checks"][0]["status"] == "WARNING" and "pbdma fault" in report["checks"][0]["summary"]
    assert res["rss_kb"] < 60 * 1024, f"{res['rss_kb'] / 1024:.0f} MB RSS for a {size_mb:.0f} MB log"
