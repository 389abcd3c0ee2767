"""Thermal zones from /sys/class/thermal: names, trip points and fast temperature reads.

Temperatures are millidegrees Celsius in ``thermal_zoneN/temp``; trip points are
``trip_point_K_temp`` / ``trip_point_K_type`` (passive, active, hot, critical). On Orin
(R36) each of cpu/gpu/cv0-2/soc0-2/tj-thermal has a 99 C passive trip bound to the clock
throttles, a 104.5 C critical trip (kernel shutdown) and a 70 C passive trip bound only to
``hot-surface-alert`` (a warning, not a throttle).

Every reading goes through :class:`Plausibility`: a value outside the physical range
(default -40..150 C), a jump faster than a die can heat or cool between two polls, or bytes
that are not a number make the zone *unreadable* for that poll, with the reason. The guard
and ERAN-GRID both read zones here, so they can never disagree about what "cool" means.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .files import read_int, read_text


@dataclass(frozen=True)
class Trip:
    kind: str  # passive | active | hot | critical
    temp_c: float


UNTYPED = "type unreadable at discovery: the zone's identity is unknown"


@dataclass
class Zone:
    """A zone is its path AND its type: the kernel gives a vanished zone's id (and so its
    path) to the next zone registered, of any type, so the path alone would let a cool
    sensor stand in for a hot one. ``kind`` is the type read at discovery, checked again at
    every read (:class:`Reader`); ``""`` = unreadable then (the zone reads as unreadable
    until it is rediscovered with a type); None = not checked (a caller that names zones
    itself)."""

    name: str  # the zone's type ("tj-thermal"); made unique with "#N" when types repeat
    path: Path  # the thermal_zoneN directory
    trips: list[Trip] = field(default_factory=list)
    kind: str | None = None

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
        typed = read_text(zdir / "type") or ""
        # Unreadable type: still guard it, under its directory name, and never filter it out
        # (it may be tj): it reads as unreadable until its type can be read.
        kind = typed or zdir.name
        if typed and not any(fnmatch.fnmatchcase(kind, pat) for pat in include):
            continue
        if typed and any(fnmatch.fnmatchcase(kind, pat) for pat in exclude):
            continue
        n = seen.get(kind, 0)
        seen[kind] = n + 1
        name = kind if n == 0 else f"{kind}#{n}"
        zones.append(Zone(name=name, path=zdir, trips=_trips(zdir), kind=typed))
    return zones


def _zone_index(name: str) -> int:
    digits = name[len("thermal_zone") :]
    return int(digits) if digits.isdigit() else 1 << 30


@dataclass(frozen=True)
class Plausibility:
    """What a real die temperature can be (the rules every reader applies).

    ``min_c``/``max_c``: the physical range; outside it the sensor is lying (an unset
    register reads -273150 or INT_MIN, a broken one 0x7fffffff). ``max_rate_c_per_s`` plus
    ``slack_c``: the largest change between two accepted readings (silicon heats fast, but
    not 50 C in a second; a stuck-then-jumping value is a fault). A rejected value never
    becomes the reference: the next reading is judged against the last accepted one and the
    time since, so a real sustained change is accepted a poll or two later.
    """

    min_c: float = -40.0
    max_c: float = 150.0
    max_rate_c_per_s: float = 50.0
    slack_c: float = 2.0

    def check(self, celsius: float, prev: tuple[float, float] | None, now: float) -> str:
        """'' when plausible, else why not."""
        if not self.min_c <= celsius <= self.max_c:
            return f"implausible {celsius:.1f} C (outside {self.min_c:g}..{self.max_c:g} C)"
        if prev is not None:
            dt = max(0.0, now - prev[1])
            if abs(celsius - prev[0]) > self.max_rate_c_per_s * dt + self.slack_c:
                return f"implausible jump {prev[0]:.1f} -> {celsius:.1f} C in {dt:.1f} s"
        return ""


class Reading(NamedTuple):
    """One zone at one poll: ``celsius`` when readable and plausible, else ``problem``.

    ``raw`` is the parsed value even when implausible (None when unparsable or unreadable),
    so a caller can still fail closed on a hot-looking jump. (A NamedTuple: the guard makes
    nine of these every second for the board's lifetime.)"""

    celsius: float | None
    problem: str = ""
    raw: float | None = None


class Reader:
    """Reads every zone's temperature with one ``pread`` per zone on kept-open descriptors.

    sysfs regenerates an attribute on each read at offset 0, so a kept descriptor gives a
    fresh value without the open/close cost (the guard polls every second for the board's
    lifetime). A failed read closes the descriptor and the next poll reopens it.
    """

    KEEP_FDS = 256  # descriptors kept open at most: 1100 zones must not starve the guard of fds

    def __init__(self, zones: list[Zone], rules: Plausibility | None = None, carry: Reader | None = None) -> None:
        self.zones = zones
        self.keep_fds = self.KEEP_FDS
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            # A quarter of the soft limit, and half of what is still free, at most: the rest stays
            # for the caller's own files (state writes), however many it already holds open.
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            try:
                in_use = len(os.listdir("/proc/self/fd"))
            except OSError:
                in_use = 0
            self.keep_fds = max(8, min(self.KEEP_FDS, soft // 4, (soft - in_use) // 2))
        self.rules = rules or Plausibility()
        self._fds: dict[str, int] = {}
        self._tfds: dict[str, int] = {}  # kept descriptors of the zones' ``type`` (identity)
        # The rate rule's memory (``carry`` hands it on to a reader re-created for a new zone
        # list): the last accepted value of each zone, the time of the previous read (when
        # most zones were last accepted), and the accept time of zones NOT accepted then.
        self._last: dict[str, float] = dict(carry._last) if carry else {}
        self._at: dict[str, float] = dict(carry._at) if carry else {}
        self._prev_now: float | None = carry._prev_now if carry else None
        # A rejected jump UP may have been real: until the zone reads something consistent
        # with it, a fall from it faster than the rate is as implausible as any other jump.
        self._suspect: dict[str, tuple[float, float]] = dict(carry._suspect) if carry else {}

    def accepted(self, name: str) -> tuple[float, float] | None:
        """The last accepted reading of ``name`` and when it was taken, if any."""
        if name not in self._last:
            return None
        at = self._at.get(name, self._prev_now)
        return (self._last[name], at if at is not None else 0.0)

    def read(self, now: float, verify: bool = False) -> dict[str, Reading]:
        """Every zone at monotonic time ``now``, as :class:`Reading` s."""
        temps, bad = self.read_split(now, verify)
        out = {name: Reading(c, "", c) for name, c in temps.items()}
        out.update(bad)
        return {z.name: out[z.name] for z in self.zones}

    def read_split(self, now: float, verify: bool = False) -> tuple[dict[str, float], dict[str, Reading]]:
        """Readable, plausible zones as name -> C, and every other zone's :class:`Reading`
        (the guard's hot path: no object per good reading).

        ``verify`` also checks that each kept descriptor still names a live file. On sysfs a
        removed zone's attribute fails to read (kernfs returns ENODEV), which the plain path
        sees; a plain filesystem would keep returning the last value through a kept
        descriptor, so callers whose decision must not rest on a vanished file (the guard
        while it sheds, ERAN-GRID) pass ``verify``."""
        temps: dict[str, float] = {}
        bad: dict[str, Reading] = {}
        rules = self.rules
        lo, hi, rate, slack = rules.min_c, rules.max_c, rules.max_rate_c_per_s, rules.slack_c
        last, at, prev_now, suspect = self._last, self._at, self._prev_now, self._suspect
        # Plausibility.check inlined (the hot path; tests/guard hold the two to one answer):
        # most zones were accepted at the previous read, so one limit serves them all.
        common = rate * max(0.0, now - prev_now) + slack if prev_now is not None else 0.0
        fds = self._fds
        keep = self.keep_fds
        pread = os.pread
        for z in self.zones:
            name = z.name
            if z.kind is not None:
                who = self._identity(z, verify)
                if who:
                    self._drop(name)
                    bad[name] = Reading(None, who)
                    continue
            fd = fds.get(name)
            try:
                if fd is None:
                    fd = os.open(z.path / "temp", os.O_RDONLY | os.O_CLOEXEC)
                    if len(fds) < keep:
                        fds[name] = fd
                    else:  # past the budget: open, read, close (the caller's own files need fds)
                        try:
                            raw = pread(fd, 32, 0)
                        finally:
                            os.close(fd)
                        fd = None
                if fd is not None:
                    raw = pread(fd, 32, 0)
                if verify and fd is not None and os.fstat(fd).st_nlink == 0:
                    self._drop(name)
                    bad[name] = Reading(None, "vanished")
                    continue
            except OSError as exc:
                # EIO/ENODATA from a sensor behind a firmware call, or the zone vanished.
                self._drop(name)
                bad[name] = Reading(None, f"unreadable ({os.strerror(exc.errno) if exc.errno else exc})")
                continue
            try:
                celsius = int(raw) / 1000.0
            except ValueError:
                self._drop(name)
                bad[name] = Reading(None, f"unparsable value {raw[:16]!r}")
                continue
            if not lo <= celsius <= hi:
                bad[name] = Reading(None, f"implausible {celsius:.1f} C (outside {lo:g}..{hi:g} C)", celsius)
                continue
            ref = last.get(name)
            if ref is not None:
                limit = rate * max(0.0, now - at[name]) + slack if at and name in at else common
                if not -limit <= celsius - ref <= limit:
                    bad[name] = Reading(None, rules.check(celsius, self.accepted(name), now), celsius)
                    if celsius > ref:
                        suspect[name] = (celsius, now)  # maybe a real spike: a fall from it is judged too
                    continue
                if suspect and name in suspect:
                    peak, when = suspect[name]
                    if peak - celsius > rate * max(0.0, now - when) + slack:
                        bad[name] = Reading(None, f"implausible fall from a rejected {peak:.1f} C", celsius)
                        continue
                    del suspect[name]
                if at:
                    at.pop(name, None)
            last[name] = celsius
            temps[name] = celsius
        if bad and prev_now is not None:
            for name in bad:
                if name in last:
                    at.setdefault(name, prev_now)  # its last accept was at the previous read (or before)
        self._prev_now = now
        return temps, bad

    def _identity(self, z: Zone, verify: bool) -> str:
        """'' when ``z``'s directory still holds a zone of ``z``'s type, else why not (re-read
        at every poll: a kept descriptor costs one pread)."""
        if not z.kind:
            return UNTYPED
        tfd = self._tfds.get(z.name)
        try:
            if tfd is None:
                tfd = os.open(z.path / "type", os.O_RDONLY | os.O_CLOEXEC)
                if len(self._fds) + len(self._tfds) + 2 <= self.keep_fds:
                    self._tfds[z.name] = tfd
                else:
                    try:
                        raw = os.pread(tfd, 64, 0)
                    finally:
                        os.close(tfd)
                    tfd = None
            if tfd is not None:
                raw = os.pread(tfd, 64, 0)
                if verify and os.fstat(tfd).st_nlink == 0:
                    return "vanished"
        except OSError as exc:
            return f"unreadable type ({os.strerror(exc.errno) if exc.errno else exc})"
        got = raw.decode(errors="replace").strip()
        if got != z.kind:
            return f"replaced: a zone of type {got[:40]!r} is at its path now, not {z.kind!r}"
        return ""

    def _drop(self, name: str) -> None:
        for fds in (self._fds, self._tfds):
            fd = fds.pop(name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        for name in list(self._fds) + list(self._tfds):
            self._drop(name)
