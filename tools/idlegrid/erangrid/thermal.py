"""Heat: thermal zones over their limit, unreadable or implausible, or the guard shedding.

Zones are read by the board library (almaboard.thermal) with the guard's plausibility rules,
and anything the rules reject counts as hot (hard pause), exactly as a stale or missing
guard state does: a sensor we cannot trust is a sensor that may be reading a board on fire.
A zone seen once and gone later counts as hot too (a vanished sensor is not a cool one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from almaboard import thermal as board_thermal
from almaboard.files import boottime, read_json, read_text, state_age
from almaboard.thermal import Plausibility, Reading


@dataclass(frozen=True)
class Heat:
    hot: bool
    reason: str  # e.g. "tj-thermal 91 °C" or "guard shedding: ..." or "" when cool


class ZoneWatch:
    """The zones of one machine, read with memory: the rate rule needs the previous accepted
    reading, and a zone that disappears must be missed rather than forgotten."""

    def __init__(self, thermal_dir: Path, rules: Plausibility | None = None) -> None:
        self.thermal_dir = thermal_dir
        self.rules = rules or Plausibility()
        self.known: set[str] = set()
        self._reader: board_thermal.Reader | None = None

    def read(self, now: float) -> dict[str, Reading]:
        # Zones are looked up afresh each read (they come and go); the reader carries the
        # rate rule's memory from one read to the next. Descriptors are not kept: this runs
        # once a second at most, and a fresh open sees a removed zone at once.
        reader = board_thermal.Reader(board_thermal.discover(self.thermal_dir), self.rules, carry=self._reader)
        try:
            readings = reader.read(now, verify=True)
        finally:
            reader.close()
        self._reader = reader
        for name in sorted(self.known - set(readings)):
            readings[name] = Reading(None, "vanished")
        self.known |= set(readings)
        return readings


def zone_heat(readings: dict[str, Reading], default_max: float, per_zone: dict[str, float]) -> Heat:
    """Hot when a zone is at or over its limit (a rejected jump to such a value included: it
    may be real), else when any zone is unreadable or implausible (it may be hot unseen)."""
    worst: tuple[float, str, float] | None = None
    for name, r in readings.items():
        temp = r.celsius if r.celsius is not None else r.raw
        if temp is None or not -273.15 < temp < 1000.0:
            continue
        limit = per_zone.get(name, default_max)
        if temp >= limit and (worst is None or temp - limit > worst[0] - worst[2]):
            worst = (temp, name, limit)
    if worst is not None:
        return Heat(True, f"{worst[1]} {worst[0]:.0f} °C")
    bad = sorted((name, r.problem) for name, r in readings.items() if r.celsius is None)
    if bad:
        return Heat(True, "; ".join(f"{name} {problem}" for name, problem in bad) + " (counts as hot)")
    return Heat(False, "")


def guard_heat(
    path: Path | None,
    stale_after: float,
    required: bool,
    now: float | None = None,
    *,
    boot: str | None = None,
    now_boottime: float | None = None,
) -> Heat:
    """The guard's verdict from its state file. Freshness is measured on CLOCK_BOOTTIME
    (``boot_id`` + ``boottime`` in the file): a wall clock stepped back cannot make a dead
    guard's last "not shedding" look fresh, nor a step forward a live guard look dead."""
    if path is None:
        return Heat(False, "")
    now = time.time() if now is None else now
    state = read_json(path, limit=1 << 16)
    if state is None:
        if not path.exists():
            return Heat(True, "thermal guard state missing") if required else Heat(False, "")
        return Heat(True, "thermal guard state unreadable")
    if not isinstance(state, dict):
        return Heat(True, "thermal guard state unreadable")
    if state.get("schema") != "alma.guard-state/1":
        return Heat(True, f"thermal guard state has unknown schema {str(state.get('schema'))[:40]!r}")
    if boot is None:
        boot = read_text(Path("/proc/sys/kernel/random/boot_id")) or "unknown"
    age = state_age(state, wall=now, boot=boot, now_boottime=boottime() if now_boottime is None else now_boottime)
    if age > stale_after:
        return Heat(True, "thermal guard state stale" + (f" ({age:.0f} s old)" if age != float("inf") else ""))
    if state.get("shedding") is not False:
        return Heat(True, f"guard shedding: {state.get('reason') or 'no reason given'}")
    return Heat(False, "")
