"""Is the owner here? Signals that never read content.

* tty/pts access times: the kernel moves a terminal's atime when someone types into it. We
  rescan ``/dev/pts`` on every poll so a new SSH login is seen at once. Serial consoles are
  ignored by default (a console cable left attached is not an owner).
* logind sessions (``/run/systemd/sessions/*``, where present): a login's start time is
  activity, and an active graphical session counts as the owner present, because its input is
  only visible through input devices, which we never open. :class:`SessionWatch` looks at the
  directory every poll (one stat) and re-reads the files only when it changed, so a login
  without a terminal (``ssh board cmd``, a graphical seat) is seen as soon as a new pts is.
* non-grid CPU load: all CPU time in ``/proc/stat`` minus our job's own (``/proc/PID/stat`` of
  every process in the job's process group) above ``cpu_busy`` of all cores.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

_VT = re.compile(r"^tty[0-9]+$")
_SERIAL = re.compile(r"^tty(S|TCU|THS|USB|ACM|AMA|AMLS|MSM|HS|mxc|GS)[0-9]+$")
_GRAPHICAL = frozenset({"x11", "wayland", "mir"})
# logind's session ids (session_id_valid: letters and digits). Anything else in the directory
# is no session: "<id>.ref" fifos, and ".#<id>XXXXXX", the file being written before its rename.
_SESSION = re.compile(r"^[A-Za-z0-9]+$")


@dataclass(frozen=True)
class Activity:
    at: float | None  # wall-clock time of the latest owner activity seen, None if never
    what: str  # e.g. "pts/3", "session 5", "cpu 63 %"


def pseudo_terminals(dev_pts: Path) -> list[str]:
    pts = str(dev_pts)
    try:
        return [f"{pts}/{n}" for n in os.listdir(pts) if n.isdigit()]
    except OSError:
        return []


def consoles(dev: Path, include_serial: bool) -> list[str]:
    d = str(dev)
    try:
        return [f"{d}/{n}" for n in os.listdir(d) if _VT.match(n) or (include_serial and _SERIAL.match(n))]
    except OSError:
        return []


def terminals(dev: Path, dev_pts: Path, include_serial: bool) -> list[str]:
    return pseudo_terminals(dev_pts) + consoles(dev, include_serial)


def tty_activity(paths: list[str]) -> Activity:
    best_at: float | None = None
    best = ""
    for path in paths:
        try:
            atime = os.stat(path).st_atime
        except OSError:
            continue  # the terminal closed between listing and stat
        if best_at is None or atime > best_at:
            best_at, best = atime, path
    if best_at is None:
        return Activity(None, "")
    head, _, name = best.rpartition("/")
    return Activity(best_at, f"pts/{name}" if head.endswith("/pts") else name)


def session_activity(sessions: Path, now: float) -> Activity:
    """logind's session files are logind's private format: read only the few keys that have
    been stable for a decade and treat anything else as absent."""
    graphical, latest = _read_sessions(sessions)
    return Activity(now, f"graphical session {graphical}") if graphical else latest


def _read_sessions(sessions: Path) -> tuple[str, Activity]:
    """(an active graphical session's name or '', the latest login's start)."""
    best = Activity(None, "")
    try:
        names = os.listdir(sessions)
    except OSError:
        return "", best
    for name in names:
        if not _SESSION.match(name):
            continue
        try:
            text = (sessions / name).read_text()
        except OSError:
            continue
        keys = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
        if keys.get("CLASS", "user") != "user" or keys.get("STATE") == "closing":
            continue
        if keys.get("TYPE") in _GRAPHICAL and keys.get("ACTIVE") == "1":
            return name, best
        try:
            started = int(keys.get("REALTIME", "0")) / 1e6
        except ValueError:
            continue
        if started and (best.at is None or started > best.at):
            best = Activity(started, f"session {name}")
    return "", best


class SessionWatch:
    """:func:`session_activity` at the cost of one stat while nothing changed. logind writes
    each session file to a temporary name and renames it in (and unlinks it at logout), so
    every login, logout and state change moves the directory's mtime; the files are read
    again only then (and every ``refresh`` seconds, should a change ever land in place).

    The sessions used to be read once per slow poll (1 s) and judged every poll against that
    copy: between two reads a login's age crossed ``idle_after`` and the job resumed under an
    owner who kept logging in, so its pause never lasted ``vacate_after``."""

    def __init__(self, sessions: Path, refresh: float = 5.0, monotonic=time.monotonic) -> None:
        self.sessions = sessions
        self.refresh = refresh
        self.monotonic = monotonic
        self._key: tuple[int, int, int] | None = None
        self._next = float("-inf")
        self._graphical = ""
        self._latest = Activity(None, "")

    def read(self, now: float) -> Activity:
        try:
            st = os.stat(self.sessions)
            key: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        mono = self.monotonic()
        if key is None or key != self._key or mono >= self._next:
            self._key, self._next = key, mono + self.refresh
            self._graphical, self._latest = _read_sessions(self.sessions)
        if self._graphical:
            return Activity(now, f"graphical session {self._graphical}")
        return self._latest


class CpuLoad:
    """Non-grid CPU share over a sliding window of ``window`` seconds."""

    def __init__(self, proc: Path = Path("/proc"), window: float = 2.0, clock=time.monotonic) -> None:
        self.proc = proc
        self.window = window
        self.clock = clock
        self._samples: deque[tuple[float, int, int, int]] = deque()  # (t, busy, total, job)
        self.ncpu = os.cpu_count() or 1

    def _system(self) -> tuple[int, int]:
        with open(self.proc / "stat") as fh:
            fields = fh.readline().split()
        values = [int(v) for v in fields[1:]]
        # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
        total = sum(values[:8])
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return total - idle, total

    def group_ticks(self, pgid: int | None) -> int:
        """CPU ticks used by every live process in process group ``pgid`` (plus the children
        they reaped)."""
        if pgid is None:
            return 0
        ticks = 0
        try:
            names = os.listdir(self.proc)
        except OSError:
            return 0
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(self.proc / name / "stat") as fh:
                    rest = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # rest[0] is field 3 (state): pgrp is field 5, utime..cstime fields 14-17
            if len(rest) > 14 and rest[2] == str(pgid):
                ticks += int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
        return ticks

    def sample(self, pgid: int | None) -> float | None:
        """Record a sample; return the non-grid share of all cores over the window, or None
        until the window has two samples."""
        now = self.clock()
        try:
            busy, total = self._system()
        except (OSError, ValueError, IndexError):
            return None
        job = self.group_ticks(pgid)
        self._samples.append((now, busy, total, job))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        if len(self._samples) < 2:
            return None
        t0, busy0, total0, job0 = self._samples[0]
        dtotal = total - total0
        if dtotal <= 0:
            return None
        djob = max(0, job - job0) if job >= job0 else 0  # the job restarted: ignore the drop
        return max(0.0, (busy - busy0 - djob) / dtotal)

    def reset(self) -> None:
        self._samples.clear()
