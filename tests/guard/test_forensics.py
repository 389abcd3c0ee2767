"""How the previous boot ended: the classifier on each kind of evidence, and the ring."""

from __future__ import annotations

import json
from typing import Any

import pytest
from almaboard.paths import Paths
from almaguard.forensics import Forensics, PmcReason, classify, died_below, pmc_family
from support_guard import FakeBoard


def ring(last_c: float, shedding: bool = False, boot: str = "prev") -> dict[str, Any]:
    return {
        "schema": "alma.guard-ring/1",
        "boot_id": boot,
        "shed_c": 89.0,
        "resume_c": 79.0,
        "samples": [{"t": "2026-11-30T10:00:00Z", "max_c": last_c, "zone": "tj-thermal", "shedding": shedding}],
    }


MARKER = {"boot_id": "prev", "t": "2026-11-30T10:00:05Z"}


def pmc(reason: str) -> PmcReason:
    return PmcReason("/sys/devices/platform/bus@0/c360000.pmc/reset_reason", reason, "L0")


@pytest.mark.parametrize(
    ("reason", "family"),
    [
        ("SYS_RESET_N", "reset-pin"),
        ("AOWDT", "watchdog"),
        ("BPMPWDT", "watchdog"),
        ("SENSOR", "thermal"),
        ("FSI_THERM", "thermal"),
        ("VREFRO_POWERBAD", "power"),
        ("VMON", "power"),
        ("MAINSWRST", "software"),
        ("SC7", "resume"),
        ("HSM", "other"),
    ],
)
def test_tegra234_reset_sources_map_to_families(reason: str, family: str) -> None:
    assert pmc_family(reason) == family


@pytest.mark.parametrize(
    ("the_ring", "marker", "the_pmc", "wd", "ended", "needle"),
    [
        (ring(50.0), MARKER, pmc("MAINSWRST"), None, "clean", "clean-shutdown marker written"),
        (ring(50.0), MARKER, None, None, "clean", "no Tegra PMC reset_reason exposed"),
        (ring(50.0), MARKER, pmc("BPMPWDT"), None, "watchdog", "reset_reason BPMPWDT"),
        (ring(50.0), None, None, ("/sys/class/watchdog/watchdog0/bootstatus", 0x20), "watchdog", "WDIOF_CARDRESET"),
        (ring(70.0), None, pmc("SENSOR"), None, "thermal", "thermal reset fired"),
        (ring(85.0), None, None, None, "thermal", "at or above the resume threshold 79.0 C"),
        (ring(60.0, shedding=True), None, None, None, "thermal", "shedding at the last record"),
        (ring(50.0), None, pmc("SYS_RESET_N"), None, "power-loss", "cold start (SYS_RESET_N)"),
        (ring(50.0), None, pmc("VMON"), None, "power-loss", "supply fault"),
        (ring(50.0), None, pmc("MAINSWRST"), None, "unknown", "kernel panic or forced reboot"),
        (ring(50.0), None, None, None, "unknown", "nothing else to tell"),
        (None, None, None, None, "unknown", "no guard record of the previous boot"),
        # a marker from an older boot does not make this one clean
        (ring(50.0), {"boot_id": "older", "t": "x"}, None, None, "unknown", "no clean-shutdown marker"),
    ],
)
def test_classify(
    the_ring: dict[str, Any] | None,
    marker: dict[str, Any] | None,
    the_pmc: PmcReason | None,
    wd: tuple[str, int] | None,
    ended: str,
    needle: str,
) -> None:
    end = classify(the_ring, marker, the_pmc, wd, now=1.78e9)
    assert end.ended == ended
    assert needle in " | ".join(end.evidence)


def test_died_below_lists_only_thermal_ends_under_the_threshold() -> None:
    a = classify(ring(85.0), None, None, None, 0)  # thermal at 85
    b = classify(ring(95.0), None, None, None, 0)  # thermal at 95 (above shed: the guard tried)
    c = classify(ring(50.0), None, pmc("SYS_RESET_N"), None, 0)  # power loss at 50
    assert died_below([a, b, c], 89.0) == [a]


def test_ring_is_kept_per_boot_and_history_is_appended_once(board: FakeBoard) -> None:
    paths = Paths(board.root)
    t = [0.0]
    f = Forensics(paths, every_s=10.0, clock=lambda: t[0])
    assert f.start(89.0, 79.0, now=100.0) is not None  # first boot ever: "unknown", recorded
    for i in range(50):
        t[0] = float(i)
        f.sample(100.0 + i, 60.0 + i * 0.1, "tj-thermal", shedding=False)
    data = json.loads(board.p("/var/lib/alma-guard/ring.json").read_text())
    assert 1 <= len(data["samples"]) <= 32 and data["boot_id"] == board.boot_id
    assert data["samples"][-1]["max_c"] >= 64.0  # the interval maximum, not the last reading

    # a restart within the same boot keeps the ring and classifies nothing
    f2 = Forensics(paths)
    assert f2.start(89.0, 79.0, now=200.0) is None
    assert f2.ring["restarts"] == 1
    f2.clean_stop(now=210.0)

    board.set_boot_id("next-boot")
    f3 = Forensics(paths)
    end = f3.start(89.0, 79.0, now=300.0)
    assert end is not None and end.ended == "clean"
    assert [e.ended for e in f3.history()] == ["unknown", "clean"]
    assert not board.p("/var/lib/alma-guard/clean-shutdown").exists()  # consumed


def test_torn_ring_file_is_not_fatal(board: FakeBoard) -> None:
    lib = board.p("/var/lib/alma-guard")
    lib.mkdir(parents=True)
    (lib / "ring.json").write_text('{"schema": "alma.guard-ring/1", "boot_id": "x", "sam')
    end = Forensics(Paths(board.root)).start(89.0, 79.0, now=1.0)
    assert end is not None and end.ended == "unknown"


def test_unwritable_state_dir_does_not_stop_the_guard(board: FakeBoard, caplog: pytest.LogCaptureFixture) -> None:
    board.p("/var/lib").mkdir(parents=True, exist_ok=True)
    board.p("/var/lib/alma-guard").write_text("a file where the directory should be")
    f = Forensics(Paths(board.root), every_s=0.0)
    with caplog.at_level("ERROR"):
        f.start(89.0, 79.0, now=1.0)
        for i in range(5):
            f.sample(2.0 + i, 50.0, "tj-thermal", False)
        f.clean_stop(now=10.0)
    assert caplog.text.count("reset forensics are off") == 1  # said once, not every poll


def test_guard_start_warns_about_a_death_below_the_threshold(
    board: FakeBoard, caplog: pytest.LogCaptureFixture
) -> None:
    from almaguard.config import GuardConfig
    from almaguard.guard import Guard
    from support_guard import orin_zones

    orin_zones(board, 40.0)
    lib = board.p("/var/lib/alma-guard")
    lib.mkdir(parents=True)
    (lib / "ring.json").write_text(json.dumps(ring(84.5, boot="previous-boot")))
    paths = Paths(board.root)
    guard = Guard(GuardConfig(), paths, forensics=Forensics(paths))
    with caplog.at_level("WARNING"):
        assert guard.run(max_polls=1) == 0
    assert "previous boot previous-boot ended: thermal" in caplog.text
    assert "the board reset at 84.5 C (tj-thermal, boot previous), below the shed threshold 89.0 C" in caplog.text


def test_a_wall_clock_step_back_does_not_stop_the_ring(board: FakeBoard) -> None:
    """The ring's period is on CLOCK_BOOTTIME: after the wall clock steps back one hour the
    ring is rewritten on time (it was not rewritten for the whole hour: the evidence that a
    board died below the threshold was lost). A guard drives it, with the wall step injected."""
    from almaguard.config import GuardConfig
    from almaguard.guard import Guard
    from support_guard import orin_zones

    orin_zones(board, 50.0)
    paths = Paths(board.root)
    boot = [100.0]
    wall = [1_780_000_000.0]
    guard = Guard(
        GuardConfig(ring_every_s=10.0),
        paths,
        wall=lambda: wall[0],
        forensics=Forensics(paths, 10.0, clock=lambda: boot[0]),
        boottime_clock=lambda: boot[0],
    )
    guard.start_forensics()
    ring = board.p("/var/lib/alma-guard/ring.json")

    def samples() -> list[dict]:
        return json.loads(ring.read_text()).get("samples", [])

    for _ in range(30):  # 30 s, as the board polls
        boot[0] += 1.0
        wall[0] += 1.0
        guard.step(boot[0])
    before = len(samples())
    assert before >= 2
    wall[0] -= 3600.0  # NTP, the RTC or an operator steps the wall clock back one hour
    for _ in range(30):
        boot[0] += 1.0
        wall[0] += 1.0
        guard.step(boot[0])
    assert len(samples()) >= before + 2  # rewritten every 10 s as before


def test_the_ring_keeps_its_period_on_the_real_boot_clock_after_a_wall_step(board: FakeBoard) -> None:
    """The same with the real CLOCK_BOOTTIME (the default): only the wall time goes back."""
    import time

    f = Forensics(Paths(board.root), every_s=0.05)
    f.start(89.0, 79.0, now=1_780_000_000.0)
    f.sample(1_780_000_000.0, 50.0, "tj-thermal", False, force=True)
    stepped = 1_780_000_000.0 - 3600.0
    deadline = time.monotonic() + 60
    while not f.sample(stepped, 51.0, "tj-thermal", False):
        assert time.monotonic() < deadline, "the ring was not rewritten after the wall clock stepped back"
        time.sleep(0.01)
    data = json.loads(board.p("/var/lib/alma-guard/ring.json").read_text())
    assert data["samples"][-1]["max_c"] == 51.0
