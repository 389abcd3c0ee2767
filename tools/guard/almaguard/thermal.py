"""Thermal zones from /sys/class/thermal: names, trip points and fast temperature reads.

Temperatures are millidegrees Celsius in ``thermal_zoneN/temp``; trip points are
``trip_point_K_temp`` / ``trip_point_K_type`` (passive, active, hot, critical). On Orin
(R36) each of cpu/gpu/cv0-2/soc0-2/tj-thermal has a 99 C passive trip bound to the clock
throttles, a 104.5 C critical trip (kernel shutdown) and a 70 C passive trip bound only to
``hot-surface-alert`` (a warning, not a throttle).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

from .fsutil import read_int, read_text


@dataclass(frozen=True)
class Trip:
    kind: str  # passive | active | hot | critical
    temp_c: float


@dataclass
class Zone:
    name: str  # the zone's type ("tj-thermal"); made unique with "#N" when types repeat
    path: Path  # the thermal_zoneN directory
    trips: list[Trip] = field(default_factory=list)

    @property
    def throttle_trip_c(self) -> float | None:
        """The highest passive trip: where the kernel starts throttling clocks.

        Lower passive trips exist (Orin's 70 C one drives only ``hot-surface-alert``), so
        the highest passive trip below any critical trip is the one that matters.
        """
        passive = [t.temp_c for t in self.trips if t.kind == "passive"]
        crit = self.critical_trip_c
        if crit is not None:
            passive = [t for t in passive if t < crit]
        return max(passive) if passive else None

    @property
    def critical_trip_c(self) -> float | None:
        crit = [t.temp_c for t in self.trips if t.kind in ("critical", "hot")]
        return min(crit) if crit else None


def _trips(zone_dir: Path) -> list[Trip]:
    trips = []
    for tfile in sorted(zone_dir.glob("trip_point_*_temp")):
        idx = tfile.name[len("trip_point_") : -len("_temp")]
        milli = read_int(tfile)
        kind = read_text(zone_dir / f"trip_point_{idx}_type")
        if milli is None or kind is None or milli <= 0:
            continue  # disabled trips read as 0 or huge negative numbers
        trips.append(Trip(kind, milli / 1000.0))
    return trips


def discover(thermal_dir: Path, include: list[str] | None = None, exclude: list[str] | None = None) -> list[Zone]:
    """Zones under ``thermal_dir`` whose type matches ``include`` globs and no ``exclude`` glob."""
    include = include or ["*"]
    exclude = exclude or []
    zones: list[Zone] = []
    seen: dict[str, int] = {}
    try:
        entries = sorted(thermal_dir.glob("thermal_zone*"), key=lambda p: _zone_index(p.name))
    except OSError:
        return []
    for zdir in entries:
        kind = read_text(zdir / "type")
        if not kind:
            kind = zdir.name  # unreadable type: still guard it, under its directory name
        if not any(fnmatch.fnmatchcase(kind, pat) for pat in include):
            continue
        if any(fnmatch.fnmatchcase(kind, pat) for pat in exclude):
            continue
        n = seen.get(kind, 0)
        seen[kind] = n + 1
        name = kind if n == 0 else f"{kind}#{n}"
        zones.append(Zone(name=name, path=zdir, trips=_trips(zdir)))
    return zones


def _zone_index(name: str) -> int:
    digits = name[len("thermal_zone") :]
    return int(digits) if digits.isdigit() else 1 << 30


class Reader:
    """Reads every zone's temperature with one ``pread`` per zone on kept-open descriptors.

    sysfs regenerates an attribute on each read at offset 0, so a kept descriptor gives a
    fresh value without the open/close cost (the guard polls every second for the board's
    lifetime). A failed read closes the descriptor and the next poll reopens it.
    """

    def __init__(self, zones: list[Zone]) -> None:
        self.zones = zones
        self._fds: dict[str, int] = {}

    def read(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for z in self.zones:
            out[z.name] = self._read_one(z)
        return out

    def _read_one(self, z: Zone) -> float | None:
        fd = self._fds.get(z.name)
        try:
            if fd is None:
                fd = os.open(z.path / "temp", os.O_RDONLY | os.O_CLOEXEC)
                self._fds[z.name] = fd
            raw = os.pread(fd, 32, 0)
            return int(raw) / 1000.0
        except (OSError, ValueError):
            # EIO/ENODATA from a sensor behind a firmware call, or garbage: unreadable now.
            self._drop(z.name)
            return None

    def _drop(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for name in list(self._fds):
            self._drop(name)
