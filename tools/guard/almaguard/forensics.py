"""Reset forensics: how did the previous boot end?

The guard keeps, under /var/lib/alma-guard (fsync'd, survives an abrupt reset):

- ``ring.json``: this boot's id and a small ring of recent maximum temperatures (the
  hottest zone over each ``ring_every_s`` interval, and whether the guard was shedding);
- ``clean-shutdown``: a marker written when the guard is stopped cleanly (system shutdown);
- ``resets.json``: the classified ends of previous boots (newest last).

At the first guard start of a new boot, the previous boot's ring is classified as
``clean``, ``thermal``, ``watchdog``, ``power-loss`` or ``unknown``, with the evidence
used. Evidence, strongest first: the Tegra PMC reset reason of *this* boot (upstream
drivers/soc/tegra/pmc.c exposes ``reset_reason``/``reset_level`` on the PMC device, e.g.
``/sys/devices/platform/bus@0/c360000.pmc/reset_reason`` on Orin), the watchdog's
``bootstatus`` (WDIOF_CARDRESET), the clean-shutdown marker, and the ring's last samples.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from almaboard.files import boottime, iso, read_json, read_text, write_json
from almaboard.paths import Paths

log = logging.getLogger("alma-guard")
RING_SCHEMA = "alma.guard-ring/1"
HISTORY_SCHEMA = "alma.guard-resets/1"
RING_SIZE = 32
HISTORY_SIZE = 20
WDIOF_CARDRESET = 0x0020  # linux/watchdog.h: "Card previously reset the CPU"

ENDINGS = ("clean", "thermal", "watchdog", "power-loss", "unknown")

# Tegra234 reset sources (drivers/soc/tegra/pmc.c, tegra234_reset_sources) by meaning.
# Older kernels name a few differently (AOTAG, VFSENSOR, SW_MAIN), so match by family.
_PMC_THERMAL = ("SENSOR", "THERM", "AOTAG", "TSENSE")
_PMC_POWER = ("VMON", "POWERBAD", "POD", "POWER_ON")
_PMC_SOFTWARE = ("MAINSWRST", "SW_MAIN", "CSITE_SW")


def pmc_family(reason: str) -> str:
    r = reason.upper()
    if "WDT" in r or "WATCHDOG" in r:
        return "watchdog"
    if any(k in r for k in _PMC_THERMAL):
        return "thermal"
    if any(k in r for k in _PMC_POWER) or r in ("POR",):
        return "power"
    if r == "SYS_RESET_N":
        return "reset-pin"  # power-on or the reset line (PMIC/reset button): a cold start
    if any(k in r for k in _PMC_SOFTWARE):
        return "software"
    if r == "SC7":
        return "resume"
    return "other"


@dataclass
class PmcReason:
    path: str
    reason: str
    level: str | None

    @property
    def family(self) -> str:
        return pmc_family(self.reason)


def read_pmc(paths: Paths) -> PmcReason | None:
    """The Tegra PMC reset reason of this boot, where the kernel exposes it."""
    platform = paths("/sys/devices/platform")
    for pattern in ("*pmc*/reset_reason", "*/*pmc*/reset_reason"):
        for f in sorted(platform.glob(pattern)):
            reason = read_text(f)
            if reason:
                level = read_text(f.parent / "reset_level")
                return PmcReason(str(f), reason, level)
    return None


def read_watchdog_bootstatus(paths: Paths) -> tuple[str, int] | None:
    for f in sorted(paths.watchdog.glob("watchdog*/bootstatus")):
        text = read_text(f)
        if text is not None:
            with contextlib.suppress(ValueError):
                return str(f), int(text, 0)
    return None


@dataclass
class Ending:
    boot_id: str
    ended: str  # one of ENDINGS
    evidence: list[str] = field(default_factory=list)
    last_max_c: float | None = None
    last_zone: str | None = None
    last_sample_at: str | None = None
    shed_c: float | None = None
    classified_at: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ending:
        known: dict[str, Any] = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def classify(
    ring: dict[str, Any] | None,
    marker: dict[str, Any] | None,
    pmc: PmcReason | None,
    wd: tuple[str, int] | None,
    now: float,
) -> Ending:
    """Classify the end of the boot recorded in ``ring`` (pure: evidence in, verdict out)."""
    prev_boot = str(ring.get("boot_id")) if ring else "unknown"
    samples = list(ring.get("samples", [])) if ring else []
    last = samples[-1] if samples else None
    shed_c = ring.get("shed_c") if ring else None
    resume_c = ring.get("resume_c") if ring else None
    end = Ending(boot_id=prev_boot, ended="unknown", classified_at=iso(now), shed_c=shed_c)
    if last:
        end.last_max_c = last.get("max_c")
        end.last_zone = last.get("zone")
        end.last_sample_at = last.get("t")
    ev = end.evidence
    if pmc:
        lvl = f", reset_level {pmc.level}" if pmc.level else ""
        ev.append(f"Tegra PMC reset_reason {pmc.reason}{lvl} ({pmc.path})")
    else:
        ev.append("no Tegra PMC reset_reason exposed by this kernel")
    wd_reset = bool(wd and wd[1] & WDIOF_CARDRESET)
    if wd_reset and wd:
        ev.append(f"watchdog bootstatus {wd[1]:#x} has WDIOF_CARDRESET ({wd[0]})")
    clean = bool(marker and ring and marker.get("boot_id") == ring.get("boot_id"))
    hot_c = resume_c if isinstance(resume_c, (int, float)) else None
    was_shedding = bool(last and last.get("shedding"))
    hot = was_shedding or (hot_c is not None and isinstance(end.last_max_c, (int, float)) and end.last_max_c >= hot_c)
    family = pmc.family if pmc else None

    if family == "watchdog" or wd_reset:
        end.ended = "watchdog"
    elif family == "thermal":
        end.ended = "thermal"
        ev.append("the SoC's own thermal reset fired")
    elif clean and marker:
        end.ended = "clean"
        ev.append(f"clean-shutdown marker written {marker.get('t')}")
        if hot:
            ev.append(f"note: the board was hot at the end ({end.last_max_c} C)")
    elif ring is None:
        end.ended = "unknown"
        ev.append("no guard record of the previous boot (first boot, or the guard never ran)")
    elif hot:
        end.ended = "thermal"
        ev.append("no clean-shutdown marker")
        if was_shedding:
            ev.append(f"the guard was shedding at the last record ({last and last.get('t')})")
        else:
            ev.append(f"last record {end.last_max_c} C ({end.last_zone}) at or above the resume threshold {hot_c} C")
    elif family == "power":
        end.ended = "power-loss"
        ev.append("no clean-shutdown marker; the PMC reports a supply fault")
    elif family == "reset-pin":
        end.ended = "power-loss"
        ev.append(
            "no clean-shutdown marker; the SoC came up from a cold start (SYS_RESET_N): power loss or a reset button"
        )
    elif family == "software":
        end.ended = "unknown"
        ev.append("software reset without a clean shutdown (kernel panic or forced reboot)")
    else:
        end.ended = "unknown"
        ev.append("no clean-shutdown marker and nothing else to tell power loss, hang or hard reset apart")
    if last and not clean:
        ev.append(f"last record {last.get('t')}: {end.last_max_c} C ({end.last_zone})")
    return end


class Forensics:
    """The guard's durable record: the ring of this boot, the clean marker, the history."""

    def __init__(self, paths: Paths, every_s: float = 10.0, clock: Callable[[], float] = boottime) -> None:
        self.paths = paths
        self.dir = paths.guard_lib
        self.ring_file = self.dir / "ring.json"
        self.marker_file = self.dir / "clean-shutdown"
        self.history_file = self.dir / "resets.json"
        self.every_s = every_s
        # The ring's period runs on CLOCK_BOOTTIME: on the wall clock a step back of an hour
        # stopped every rewrite for that hour, and the evidence of a death below the
        # threshold with it. Wall time only stamps the samples.
        self.clock = clock
        self.boot_id = read_text(paths.boot_id_file) or "unknown"
        self.ring: dict[str, Any] = {}
        self._interval_max: tuple[float, str] | None = None
        self._last_flush = float("-inf")
        self._write_failed = False
        self.write_error = ""  # the last failed write, for the guard's STATUS= and state

    # -- start of a guard run ----------------------------------------------------------
    def start(self, shed_c: float | None, resume_c: float | None, now: float) -> Ending | None:
        """Classify the previous boot (once per boot) and open this boot's ring."""
        prev = read_json(self.ring_file)
        ending = None
        if isinstance(prev, dict) and prev.get("boot_id") == self.boot_id:
            self.ring = prev  # the guard restarted within this boot (crash, kill -9, watchdog)
            self.ring["restarts"] = int(self.ring.get("restarts", 0)) + 1
        else:
            ring = prev if isinstance(prev, dict) and prev.get("schema") == RING_SCHEMA else None
            ending = classify(ring, self._marker(), read_pmc(self.paths), read_watchdog_bootstatus(self.paths), now)
            self._append_history(ending)
            self.ring = {
                "schema": RING_SCHEMA,
                "boot_id": self.boot_id,
                "started": iso(now),
                "samples": [],
                "restarts": 0,
            }
        self.ring["shed_c"] = shed_c
        self.ring["resume_c"] = resume_c
        with contextlib.suppress(OSError):
            self.marker_file.unlink()  # a marker only ever speaks for the stop that wrote it
        self.flush(now)
        return ending

    def _marker(self) -> dict[str, Any] | None:
        data = read_json(self.marker_file)
        return data if isinstance(data, dict) else None

    def _append_history(self, ending: Ending) -> None:
        hist = self.history()
        hist.append(ending)
        data = {"schema": HISTORY_SCHEMA, "boots": [e.to_json() for e in hist[-HISTORY_SIZE:]]}
        try:
            write_json(self.history_file, data)
        except OSError as exc:
            log.error("cannot write %s: %s", self.history_file, exc.strerror)

    def history(self) -> list[Ending]:
        data = read_json(self.history_file)
        if not isinstance(data, dict):
            return []
        return [Ending.from_json(b) for b in data.get("boots", []) if isinstance(b, dict)]

    # -- during the run ----------------------------------------------------------------
    def sample(self, now: float, max_c: float | None, zone: str | None, shedding: bool, force: bool = False) -> bool:
        """Track the interval maximum; fsync the ring every ``every_s`` (boot clock) or when
        forced. ``now`` is the wall time that stamps the sample."""
        if max_c is not None and zone is not None and (self._interval_max is None or max_c > self._interval_max[0]):
            self._interval_max = (max_c, zone)
        if not force and self.clock() - self._last_flush < self.every_s:
            return False
        if self._interval_max is not None:
            m, z = self._interval_max
            samples = self.ring.setdefault("samples", [])
            samples.append({"t": iso(now), "max_c": round(m, 1), "zone": z, "shedding": shedding})
            del samples[:-RING_SIZE]
            self._interval_max = None
        self.flush(now)
        return True

    def flush(self, now: float) -> None:
        self._last_flush = self.clock()
        try:
            write_json(self.ring_file, self.ring, durable=True)
        except OSError as exc:
            # A full or read-only /var must not stop the guard from guarding: say it once.
            if not self._write_failed:
                log.error("cannot write %s: %s (reset forensics are off)", self.ring_file, exc.strerror)
            self._write_failed = True
            self.write_error = f"cannot write {self.ring_file}: {exc.strerror or exc}"
        else:
            self._write_failed = False
            self.write_error = ""

    def clean_stop(self, now: float) -> None:
        """The guard is being stopped in order: flush the ring, then write the marker."""
        self.sample(now, None, None, False, force=True)
        try:
            write_json(self.marker_file, {"boot_id": self.boot_id, "t": iso(now)}, durable=True)
        except OSError as exc:
            log.error("cannot write %s: %s", self.marker_file, exc.strerror)


def pending_ending(paths: Paths, now: float) -> Ending | None:
    """The previous boot's classification when the guard has not run yet this boot."""
    ring = read_json(paths.guard_lib / "ring.json")
    boot = read_text(paths.boot_id_file) or "unknown"
    if isinstance(ring, dict) and ring.get("boot_id") == boot:
        return None
    marker = read_json(paths.guard_lib / "clean-shutdown")
    return classify(
        ring if isinstance(ring, dict) else None,
        marker if isinstance(marker, dict) else None,
        read_pmc(paths),
        read_watchdog_bootstatus(paths),
        now,
    )


def died_below(history: list[Ending], shed_c: float) -> list[Ending]:
    """Thermal ends recorded below the current shed threshold: the guard did not protect."""
    return [
        e for e in history if e.ended == "thermal" and isinstance(e.last_max_c, (int, float)) and e.last_max_c < shed_c
    ]


__all__ = ["ENDINGS", "Ending", "Forensics", "classify", "died_below", "pending_ending", "read_pmc"]
