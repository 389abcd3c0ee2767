"""The thermal guard loop: shed work before the ceiling, resume after cooling and a hold-off.

``Guard.step(now)`` is one poll with an injected monotonic clock (tests drive it
deterministically); ``Guard.run()`` is the service loop with sd_notify keep-alives.

Rules (the invariants of docs/guard.md, "Invariants"):
- a zone is *readable* at a poll when its value parses and passes the plausibility rules
  (almaboard.thermal.Plausibility); anything else makes it unreadable for that poll;
- any readable zone at or above its shed threshold, or a zone rejected for an implausible
  jump to a value at or above it -> pause the work at once (this poll);
- no zone readable at all -> pause (fail closed); some unreadable -> alert, keep going;
- paused -> resume only when EVERY zone (including any that vanished) is readable and below
  its resume threshold and has stayed so for ``holdoff_s`` without interruption
  (hysteresis + hold-off: a sensor that jitters by a few degrees cannot make the work flap);
  a zone that is unreadable blocks the resume, and a SIGTERM in that state leaves work paused;
- an I/O error on the guard's own files (state, pause record, forensics) or on the notify
  socket is logged once, shown in STATUS= and the state's ``errors``, and never stops the loop;
- never kill anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import thermal
from almaboard.files import boot_id, boottime, boottime_stamp, iso, read_json, write_json
from almaboard.paths import Paths

from .config import GuardConfig, Thresholds
from .forensics import Ending, Forensics, died_below
from .notify import Notifier
from .pause import Pauser, slice_path

log = logging.getLogger("alma-guard")
STATE_SCHEMA = "alma.guard-state/1"


@dataclass
class GuardStatus:
    shedding: bool = False
    since_wall: float = 0.0
    reason: str = "starting"
    zones: dict[str, float] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    boot_id: str = "unknown"

    def to_state(self, now_wall: float, now_boottime: float = 0.0) -> dict[str, Any]:
        """The state file of docs/formats.md, exactly. Readers judge its freshness by
        ``boot_id`` + ``boottime`` (CLOCK_BOOTTIME), never by the wall-clock ``updated``."""
        return {
            "schema": STATE_SCHEMA,
            "boot_id": self.boot_id,
            "boottime": boottime_stamp(now_boottime),
            "stuck": list(self.stuck),
            "updated": iso(now_wall),
            "shedding": self.shedding,
            "since": iso(self.since_wall),
            "reason": self.reason,
            "zones": {k: round(v, 1) for k, v in self.zones.items()},
            "unreadable": list(self.unreadable),
            "errors": list(self.errors),
        }


class Guard:
    def __init__(
        self,
        cfg: GuardConfig,
        paths: Paths,
        *,
        wall: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
        pauser: Pauser | None = None,
        forensics: Forensics | None = None,
        boottime_clock: Callable[[], float] = boottime,
    ) -> None:
        self.cfg = cfg
        self.boottime = boottime_clock
        self.paths = paths
        self.wall = wall
        self.notifier = notifier or Notifier(env={})
        self.cgroup = slice_path(paths.cgroup, cfg.slice)
        # Signals go to real processes whatever --root says, so their states come from the real /proc.
        self.pauser = pauser or Pauser(self.cgroup, paths.guard_run / "paused.json", Path("/proc"))
        self.forensics = forensics
        self.zones: list[thermal.Zone] = []
        self._untyped: set[str] = set()  # zones whose type could not be read: identity unknown
        self.thresholds: dict[str, Thresholds] = {}
        self._shed_c: dict[str, float] = {}
        self.reader = thermal.Reader([], cfg.plausibility)
        self._last_discover = float("-inf")
        self.status = GuardStatus(since_wall=wall(), boot_id=boot_id(paths.boot_id_file))
        self._thaw_retry_at: float | None = None  # a failed thaw is retried from then on
        self._thaw_backoff = 1.0
        self._probe = ""  # the next zone's directory, checked every poll
        self._stuck_next = float("-inf")
        self._stuck_since: dict[str, tuple[float, float]] = {}  # zone -> (value, since)
        self._stuck: list[str] = []
        self._cool_since: float | None = None
        self._last_state_write = float("-inf")
        self._last_unreadable: list[str] = []
        self._last_errors: list[str] = []
        self.transitions: list[tuple[float, str, str]] = []  # (now, "shed"|"resume", reason)
        self._io_errors: dict[str, str] = {}  # what -> message; logged when it first appears
        self._problems: dict[str, str] = {}
        # The zones a previous guard watched: from its pause record, else from the forensics
        # ring on the other filesystem (/var/lib), so a zone that vanished is still waited for.
        recorded = dict(self.pauser.recorded_zones)
        if forensics is not None and not recorded:
            ring = read_json(forensics.ring_file)
            same_boot = isinstance(ring, dict) and ring.get("boot_id") == forensics.boot_id
            zones = ring.get("zones") if same_boot and isinstance(ring, dict) else None
            if isinstance(zones, dict):
                recorded = {str(k): str(v) for k, v in zones.items()}
        self.discover(float("-inf"))
        # Zones a previous guard of this boot watched and that are gone now stay on the list
        # (unreadable until they come back): a vanished sensor is not a cool one.
        watched = {str(z.path) for z in self.zones}
        for name, path in recorded.items():
            if path not in watched:
                unique, n = name, 1
                while unique in self.thresholds:
                    unique, n = f"{name.split('#', 1)[0]}#{n}", n + 1
                base = name.split("#", 1)[0]
                kind = "" if base == Path(path).name else base  # recorded untyped: still unknown
                self._add_zone(thermal.Zone(name=unique, path=Path(path), kind=kind))
                watched.add(path)
        if self.pauser.paused:
            # A previous guard (crashed or killed) left the work paused: adopt that pause.
            self.status.shedding = True
            self.status.reason = f"adopted a pause ({self.pauser.method}) left by a previous guard"

    # -- zones ---------------------------------------------------------------------------
    def discover(self, now: float) -> None:
        """Add the zones present now. A zone is its sysfs path AND its type: a zone seen
        before and gone now is kept (unreadable) for the guard's life; a zone of another type
        at its path (the kernel reuses the lowest free id) is a new zone, never the old one
        (the reader checks every poll that each path still holds its type); a new zone whose
        name is taken (``soc-thermal`` vanished, its sibling renumbered) gets a name of its
        own. A zone whose type could not be read is kept under its directory name, blocks like
        an unreadable critical zone, and is replaced once its type reads."""
        self._last_discover = now
        found = thermal.discover(self.paths.thermal, self.cfg.include, self.cfg.exclude)
        known = {(str(z.path), z.kind) for z in self.zones}
        typed_now = {str(z.path) for z in found if z.kind}
        paths = {str(z.path) for z in self.zones}
        # An untyped zone whose type reads now: its identity is known at last; replace it.
        keep = [z for z in self.zones if z.kind or str(z.path) not in typed_now]
        # A type unreadable now at a path we already guard: that zone reports it itself.
        new = [z for z in found if (str(z.path), z.kind) not in known and (z.kind or str(z.path) not in paths)]
        if not new and len(keep) == len(self.zones) and self.zones:
            self._probe = self._next_zone_path()
            return
        names = {z.name for z in keep}
        zones = list(keep)
        for z in new:
            name, n = z.name, 1
            while name in names:
                base = z.name.split("#", 1)[0]
                name, n = f"{base}#{n}", n + 1
            names.add(name)
            zones.append(thermal.Zone(name=name, path=z.path, trips=z.trips, kind=z.kind))
        self._set_zones(zones)
        self._probe = self._next_zone_path()

    def _next_zone_path(self) -> str:
        """Where the kernel puts the next zone: the lowest id no zone holds (thermal_core
        allocates ids with ida_alloc, lowest free first, so a gap left before the guard
        started is filled before max + 1). One stat of it per poll sees a zone that appears at
        its very next poll, not at the 30 s rediscovery. (A zone reusing a vanished one's id
        has that one's path, which stays on the list: it is read in its place.)"""
        held = set()
        for z in self.zones:
            digits = z.path.name[len("thermal_zone") :]
            if digits.isdigit():
                held.add(int(digits))
        free = next(i for i in range(len(held) + 1) if i not in held)
        return os.path.join(self.paths.thermal, f"thermal_zone{free}")

    def _add_zone(self, zone: thermal.Zone) -> None:
        self._set_zones([*self.zones, zone])

    def _set_zones(self, zones: list[thermal.Zone]) -> None:
        old = self.reader
        old.close()
        self.zones = zones
        self._untyped = {z.name for z in zones if z.kind == ""}
        self.thresholds = {z.name: self.cfg.thresholds(z) for z in zones}
        self._shed_c = {name: th.shed_c for name, th in self.thresholds.items()}
        self.reader = thermal.Reader(zones, self.cfg.plausibility, carry=old)
        known = {z.name: str(z.path) for z in zones}
        self.pauser.remember_zones(known)
        if self.forensics is not None:
            self.forensics.ring["zones"] = known

    @property
    def min_shed_c(self) -> float | None:
        return min((t.shed_c for t in self.thresholds.values()), default=None)

    @property
    def min_resume_c(self) -> float | None:
        return min((t.resume_c for t in self.thresholds.values()), default=None)

    # -- one poll ------------------------------------------------------------------------
    def step(self, now: float) -> str | None:
        """One poll at monotonic time ``now``; returns "shed", "resume" or None."""
        st = self.status
        every = 30.0 if self.zones and not self._untyped else 1.0  # an untyped zone may read soon
        if now - self._last_discover >= every or os.access(self._probe, os.F_OK):
            self.discover(now)  # sensors may be probed late or come back
        # While shedding, also check that kept descriptors still name live files (a resume
        # must never rest on a vanished sensor's last value).
        ok, bad = self.reader.read_split(now, verify=st.shedding)
        if bad and any(r.problem.startswith("replaced") and self._problems.get(n) != r.problem for n, r in bad.items()):
            # Another zone registered at a known zone's path: guard it from this very poll
            # (it may be the hot one), not from the next rediscovery.
            self.discover(now)
            ok, bad = self.reader.read_split(now, verify=st.shedding)
        thresholds = self.thresholds
        shed_c = self._shed_c
        hot = [(n, t, thresholds[n]) for n, t in ok.items() if t >= shed_c[n]]
        problems: dict[str, str] = {}
        unreadable: list[str] = []
        if bad:
            lo, hi = self.cfg.plausible_min_c, self.cfg.plausible_max_c
            for name, (_celsius, problem, raw) in bad.items():
                problems[name] = problem
                # A rejected jump to a hot value (within the physical range): maybe real, shed.
                if raw is not None and lo <= raw <= hi and raw >= thresholds[name].shed_c:
                    hot.append((name, raw, thresholds[name]))
            unreadable = sorted(problems)
        st.zones = ok
        st.unreadable = unreadable
        changed = unreadable != self._last_unreadable
        self._note_problems(problems)
        self._last_unreadable = unreadable

        action = self._decide(now, ok, hot, problems, self._blind(unreadable) if unreadable else "")
        if st.shedding and action is None:
            res = self.pauser.refresh()
            if res is not None:
                log.warning("paused more work: %s", res.detail)
        if not st.shedding and self._thaw_retry_at is not None and now >= self._thaw_retry_at:
            self._retry_thaw(now)
        if ok and now >= self._stuck_next:  # every 10 s is plenty against a 10 min threshold
            self._stuck_next = now + 10.0
            changed = self._track_stuck(now, ok) or changed
        now_wall = self.wall()
        self._collect_errors()
        changed = changed or st.errors != self._last_errors
        # The refresh period runs on the monotonic clock: a wall clock stepped back must not
        # stop the state file (the readers' proof of life) from being rewritten.
        if action or changed or now - self._last_state_write >= self.cfg.state_every_s:
            self._last_state_write = now
            self.write_state(now_wall)
        if self.forensics is not None:
            # A hot jump the rate rule rejected still counts for forensics: it may be real.
            seen = {**ok, **{n: t for n, t, _th in hot}} if bad and hot else ok
            hottest = max(seen.items(), key=lambda kv: kv[1]) if seen else (None, None)
            self.forensics.sample(now_wall, hottest[1], hottest[0], st.shedding, force=action is not None)
        if not self.notifier.keepalive() and self.notifier.address is not None:
            self._io_error("notify", f"cannot notify systemd at {self.notifier.address!r}")
        elif self._io_errors:
            self._io_ok("notify")
        return action

    def _note_problems(self, problems: dict[str, str]) -> None:
        """Log sensors that became unreadable (once) or all readable again; EMFILE is an I/O error."""
        if problems != self._problems:
            new = sorted(set(problems) - set(self._problems))
            if new:
                log.warning("sensor(s) unreadable: %s", ", ".join(f"{n} ({problems[n]})" for n in new))
            if not problems:
                log.info("all sensors readable again")
        self._problems = problems
        if problems or "fds" in self._io_errors:
            out = [n for n, p in problems.items() if "Too many open files" in p]
            if out:
                self._io_error("fds", f"out of file descriptors: {len(out)} zone(s) unreadable (EMFILE)")
            else:
                self._io_ok("fds")

    def _decide(
        self,
        now: float,
        ok: dict[str, float],
        hot: list[tuple[str, float, Thresholds]],
        problems: dict[str, str],
        blind: str,
    ) -> str | None:
        """The rule of one poll: blind or sensorless sheds (fail closed), heat sheds, and only
        a cool, fully readable board resumes, after the hold-off. "shed", "resume" or None."""
        st = self.status
        action: str | None = None
        if not ok and not hot:
            why = "no thermal zone found" if not self.zones else "no thermal sensor readable"
            if not st.shedding:
                action = self._shed(now, f"{why} (fail closed)")
            self._cool_since = None
        elif blind and not hot:
            if not st.shedding:
                action = self._shed(now, f"{blind} (fail closed)")
            self._cool_since = None
        elif not st.shedding:
            if hot:
                n, t, th = max(hot, key=lambda x: x[1] - x[2].shed_c)
                action = self._shed(now, f"{n} {t:.1f} C >= shed {th.shed_c:.1f} C")
        else:
            cool = not problems and all(t < self.thresholds[n].resume_c for n, t in ok.items())
            if not cool:
                self._cool_since = None
            elif self._cool_since is None:
                self._cool_since = now
            elif now - self._cool_since >= self.cfg.holdoff_s:
                action = self._resume(now)
        return action

    # -- invariant 4: I/O errors on our own paths are reported, never fatal -------------
    def _io_error(self, what: str, message: str) -> None:
        if self._io_errors.get(what) != message:
            log.error("%s (the guard keeps guarding)", message)
        self._io_errors[what] = message

    def _io_ok(self, what: str) -> None:
        if self._io_errors.pop(what, None) is not None:
            log.info("%s: writable again", what)

    def _collect_errors(self) -> None:
        fx = self.forensics
        if not (
            self._io_errors or self.status.errors or self.pauser.record_error or (fx is not None and fx.write_error)
        ):
            return  # the common case: nothing to report, nothing to clear
        self.pauser.retry_record()
        if self.pauser.record_error:
            self._io_error("record", self.pauser.record_error)
        else:
            self._io_ok("record")
        if self.forensics is not None and self.forensics.write_error:
            self._io_error("forensics", self.forensics.write_error)
        elif self.forensics is not None:
            self._io_ok("forensics")
        errors = sorted(self._io_errors.values())
        if errors != self.status.errors:
            self.status.errors = errors
            self.notifier.status(self._status_text())

    def _status_text(self) -> str:
        st = self.status
        text = f"{'shedding' if st.shedding else 'normal'}: {st.reason}"
        if st.errors:
            text += "; I/O errors: " + "; ".join(st.errors)
        return text

    def _shed(self, now: float, reason: str) -> str:
        return self._transition(now, "shed", reason, self.pauser.pause().detail)

    def _resume(self, now: float) -> str:
        hottest = max(self.status.zones.items(), key=lambda kv: kv[1])
        reason = (
            f"all zones below resume threshold for {self.cfg.holdoff_s:.0f} s (hottest {hottest[0]} {hottest[1]:.1f} C)"
        )
        res = self.pauser.resume()
        self._after_thaw(now, res.detail)
        return self._transition(now, "resume", reason, res.detail)

    def _after_thaw(self, now: float, detail: str) -> None:
        """A thaw that failed is an error shown until a retry succeeds (backoff 1 s .. 16 s):
        work the guard froze must never stay frozen because one write failed."""
        if self.pauser.thaw_error:
            self._io_error("thaw", f"{self.pauser.thaw_error}; retrying every {self._thaw_backoff:.0f} s")
            self._thaw_retry_at = now + self._thaw_backoff
            self._thaw_backoff = min(16.0, self._thaw_backoff * 2)
        else:
            if self._thaw_retry_at is not None:
                log.info("thawed after retrying: %s", detail)
            self._thaw_retry_at = None
            self._thaw_backoff = 1.0
            self._io_ok("thaw")

    def _retry_thaw(self, now: float) -> None:
        self._after_thaw(now, self.pauser.resume().detail)
        self.notifier.status(self._status_text())

    # -- invariant 3: blind is hot -------------------------------------------------------
    def _blind(self, unreadable: list[str]) -> str:
        """Why the unreadable zones are too many to trust the rest, or '' (one flaky zone of
        nine only alerts): a critical zone (tj) unreadable, or at least the configured share."""
        import fnmatch

        # A zone whose type never read may be tj: it counts as critical.
        crit = [
            n
            for n in unreadable
            if n in self._untyped or any(fnmatch.fnmatchcase(n.split("#", 1)[0], p) for p in self.cfg.critical)
        ]
        if crit:
            return f"critical zone(s) unreadable: {', '.join(crit[:5])}"
        if self.zones and len(unreadable) >= self.cfg.unreadable_shed_share * len(self.zones):
            return f"{len(unreadable)} of {len(self.zones)} zones unreadable"
        return ""

    def _track_stuck(self, now: float, ok: dict[str, float]) -> bool:
        """Flag zones whose value has not moved for stuck_after_s (a WARNING, never a pause)."""
        seen = self._stuck_since
        limit = self.cfg.stuck_after_s
        stuck = []
        for name, t in ok.items():
            prev = seen.get(name)
            if prev is None or prev[0] != t:
                seen[name] = (t, now)
            elif now - prev[1] >= limit:
                stuck.append(name)
        if stuck != self._stuck:
            new = sorted(set(stuck) - set(self._stuck))
            if new:
                log.warning("sensor(s) stuck on one value for %.0f s: %s", limit, ", ".join(new))
            self._stuck = stuck
            self.status.stuck = sorted(stuck)
            return True  # a state write now: readers must see the flag
        return False

    def _transition(self, now: float, kind: str, reason: str, detail: str) -> str:
        st = self.status
        st.shedding, st.since_wall, st.reason = kind == "shed", self.wall(), reason
        self._cool_since = None
        self.transitions.append((now, kind, reason))
        log.warning("%s: %s; %s", kind.upper(), reason, detail)
        self.notifier.status(self._status_text())
        return kind

    def write_state(self, now_wall: float) -> None:
        """The state file; when /run/alma-guard is not writable, the same state (with the
        error in it) goes to /var/lib/alma-guard/state.json, where `alma-guard status` looks
        next, so the guard is never silent about it."""
        self._last_errors = list(self.status.errors)
        state = self.status.to_state(now_wall, self.boottime())
        try:
            write_json(self.paths.guard_state, state, durable=False)
        except OSError as exc:
            self._io_error("state", f"cannot write {self.paths.guard_state}: {exc.strerror or exc}")
            self.status.errors = sorted(self._io_errors.values())
            with contextlib.suppress(OSError):
                write_json(
                    self.paths.guard_state_fallback, self.status.to_state(now_wall, self.boottime()), durable=False
                )
        else:
            if "state" in self._io_errors:
                self._io_ok("state")
                self.status.errors = sorted(self._io_errors.values())
            with contextlib.suppress(FileNotFoundError, OSError):
                self.paths.guard_state_fallback.unlink()

    def start_forensics(self) -> Ending | None:
        """Open this boot's forensics ring (classifying the previous boot once per boot); the
        ring also keeps the zones this guard watches, for a guard restarted without a record."""
        if self.forensics is None:
            return None
        ending = self.forensics.start(self.min_shed_c, self.min_resume_c, self.wall())
        self.forensics.ring["zones"] = {z.name: str(z.path) for z in self.zones}
        self.forensics.flush(self.wall())
        return ending

    # -- the service loop ----------------------------------------------------------------
    def run(self, *, max_polls: int | None = None, clock: Callable[[], float] = time.monotonic) -> int:
        """Poll until SIGTERM/SIGINT; returns the exit code."""
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        stop: list[int] = []

        def _on_signal(signum: int, _frame: object) -> None:
            stop.append(signum)

        hups: list[int] = []

        def _on_hup(signum: int, _frame: object) -> None:
            hups.append(signum)

        old_wakeup = signal.set_wakeup_fd(wfd)
        old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        # SIGHUP (a reload request, a closed terminal) never stops the guard: it is logged and
        # ignored; the configuration is read at start (restart to apply a change).
        old[signal.SIGHUP] = signal.signal(signal.SIGHUP, _on_hup)
        try:
            now = clock()
            ending = self.start_forensics()
            if ending is not None:
                log.warning("previous boot %s ended: %s (%s)", ending.boot_id, ending.ended, "; ".join(ending.evidence))
            if self.forensics is not None and self.min_shed_c is not None:
                for e in died_below(self.forensics.history(), self.min_shed_c):
                    log.warning(
                        "the board reset at %.1f C (%s, boot %s), below the shed threshold %.1f C that was supposed "
                        "to protect it: set measured_reset_c in /etc/alma/guard.d/50-board.toml",
                        e.last_max_c,
                        e.last_zone,
                        e.boot_id[:8],
                        self.min_shed_c,
                    )
            summary = ", ".join(f"{n} shed {t.shed_c:.1f}/resume {t.resume_c:.1f}" for n, t in self.thresholds.items())
            log.info("guarding %s: %s", self.cgroup, summary or "NO ZONES FOUND (fail closed)")
            self.step(now)
            self.notifier.ready(("shedding: " if self.status.shedding else "normal: ") + self.status.reason)
            polls = 1
            next_at = now + self.cfg.interval_s
            # A poll period longer than half of WatchdogSec would get the guard killed: pet
            # systemd between polls then (a hung poll still starves it, as it should).
            pet_every = self.notifier.watchdog_s / 3 if self.notifier.watchdog_s else None
            while not stop and (max_polls is None or polls < max_polls):
                timeout = max(0.0, next_at - clock())
                if timeout:
                    if pet_every is not None and timeout > pet_every:
                        timeout = pet_every
                    select.select([rfd], [], [], timeout)
                    try:
                        while os.read(rfd, 64):
                            pass
                    except BlockingIOError:
                        pass
                if stop:
                    break
                if hups:
                    hups.clear()
                    log.warning("SIGHUP ignored: the configuration is read at start; restart alma-guard to apply it")
                if clock() < next_at:
                    self.notifier.keepalive()
                    continue
                now = clock()
                self.step(now)
                polls += 1
                next_at += self.cfg.interval_s
                if next_at < now:  # overran (suspend, a slow sensor): don't burst to catch up
                    next_at = now + self.cfg.interval_s
            self._stop()
            return 0
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old.items():
                signal.signal(s, h)
            os.close(rfd)
            os.close(wfd)

    def _stop(self) -> None:
        self.notifier.stopping()
        st = self.status
        if st.shedding:
            # Resume on the way out only with every zone readable and below shed (a system
            # shutdown must not leave frozen work behind); blind or hot, the work stays paused.
            if st.zones and not st.unreadable and all(t < self.thresholds[n].shed_c for n, t in st.zones.items()):
                res = self.pauser.resume()
                st.shedding, st.since_wall, st.reason = (
                    False,
                    self.wall(),
                    "guard stopped while below shed: work resumed",
                )
                log.warning("stopping: %s", res.detail)
            else:
                # Resuming hot work with nobody watching is how boards die: leave it paused;
                # the next guard adopts the pause from paused.json.
                log.warning("stopping while hot or blind: the work stays paused for the next guard")
                self.pauser.refresh()  # retry the record if the state dir came back
        self.write_state(self.wall())
        if self.forensics is not None:
            self.forensics.clean_stop(self.wall())
        self.reader.close()
        self.notifier.close()
