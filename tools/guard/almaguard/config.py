"""Configuration of the guard and the health watchdog (TOML, read with tomllib).

``/etc/alma/guard.toml`` then ``/etc/alma/guard.d/*.toml`` in name order (the per-board
measured values go in a drop-in, e.g. ``guard.d/50-board.toml``); the same for health.
A missing file means defaults; a broken one is an error naming ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import fields as F
from almaboard.config import load_layers, load_toml_layers
from almaboard.thermal import Plausibility, Zone

from .errors import GuardError

__all__ = ["GUARD_DEFAULTS", "GuardConfig", "Thresholds", "load_guard_config", "load_toml_layers"]

GUARD_DEFAULTS: dict[str, Any] = {
    "interval_s": 1.0,
    "slice": "alma-work.slice",
    # Shed at (measured reset - margin), else (throttle trip - margin).
    "margin_c": 10.0,
    "measured_reset_c": None,
    # Resume only below (shed - hysteresis) ...
    "hysteresis_c": 10.0,
    # ... held continuously for this long.
    "holdoff_s": 60.0,
    # When a zone exposes no passive trip and no measured reset is configured.
    "fallback_shed_c": 85.0,
    "include": ["*"],
    "exclude": [],
    # How often the forensics ring is fsync'd (and on every shed/resume).
    "ring_every_s": 10.0,
    # The state file is rewritten on change and at least this often (formats.md).
    "state_every_s": 5.0,
    # Plausibility (almaboard.thermal.Plausibility): outside this range, or changing faster
    # than this between polls, a reading makes its zone unreadable (fail closed).
    "plausible_min_c": -40.0,
    "plausible_max_c": 150.0,
    "max_rate_c_per_s": 50.0,
    # Fail closed while blind: any of these zones (type globs) unreadable, or at least this
    # share of all zones unreadable, sheds the work even though the rest read cool.
    "critical": ["tj-thermal"],
    "unreadable_shed_share": 0.5,
    # A zone whose value has not changed by one millidegree for this long is flagged "stuck"
    # (a WARNING in the state and alma-health, never a pause by itself).
    "stuck_after_s": 600.0,
}


@dataclass
class Thresholds:
    shed_c: float
    resume_c: float
    source: str  # why this value: "config", "measured reset 90.0 C - 10.0", "passive trip 99.0 C - 10.0", ...


@dataclass
class GuardConfig:
    interval_s: float = 1.0
    slice: str = "alma-work.slice"
    margin_c: float = 10.0
    measured_reset_c: float | None = None
    hysteresis_c: float = 10.0
    holdoff_s: float = 60.0
    fallback_shed_c: float = 85.0
    include: list[str] = field(default_factory=lambda: ["*"])
    exclude: list[str] = field(default_factory=list)
    ring_every_s: float = 10.0
    state_every_s: float = 5.0
    plausible_min_c: float = -40.0
    plausible_max_c: float = 150.0
    max_rate_c_per_s: float = 50.0
    zones: dict[str, dict[str, float]] = field(default_factory=dict)  # per-zone shed_c/resume_c
    critical: list[str] = field(default_factory=lambda: ["tj-thermal"])
    unreadable_shed_share: float = 0.5
    stuck_after_s: float = 600.0
    files: list[Path] = field(default_factory=list)

    def thresholds(self, zone: Zone) -> Thresholds:
        """Shed/resume temperatures for one zone, with where they came from."""
        per = self.zones.get(zone.name, {})
        if "shed_c" in per:
            shed, source = float(per["shed_c"]), f'[zones."{zone.name}"] shed_c'
        elif self.measured_reset_c is not None:
            shed = self.measured_reset_c - self.margin_c
            source = f"measured reset {self.measured_reset_c:.1f} C - margin {self.margin_c:.1f}"
        elif zone.throttle_trip_c is not None:
            shed = zone.throttle_trip_c - self.margin_c
            source = f"passive trip {zone.throttle_trip_c:.1f} C - margin {self.margin_c:.1f}"
        else:
            shed, source = self.fallback_shed_c, "fallback_shed_c (no passive trip, no measured reset)"
        resume = float(per.get("resume_c", shed - self.hysteresis_c))
        if resume >= shed:
            raise GuardError(
                f"zone {zone.name}: resume_c {resume:.1f} must be below shed_c {shed:.1f}",
                hint="lower resume_c or raise hysteresis_c",
            )
        return Thresholds(shed, resume, source)

    @property
    def plausibility(self) -> Plausibility:
        return Plausibility(self.plausible_min_c, self.plausible_max_c, self.max_rate_c_per_s)


# Every [guard] key's type and range (almaboard.fields: nan, inf, booleans and wrong types are
# refused with file:line). Temperatures stay within what a die can read; periods are > 0 where
# a loop waits on them, so a zero or a week-long poll is a typo, not a setting.
_TEMP = F.number(-273.0, 300.0)
_GUARD_FIELDS: F.Schema = {
    "interval_s": F.duration(above=0.0, hi=3600.0),
    "slice": F.string(r"[A-Za-z0-9:_.@/\\-]+", max_len=256, what="a systemd slice name or cgroup path"),
    "margin_c": F.number(0.0, 100.0),
    "measured_reset_c": F.optional(_TEMP),
    "hysteresis_c": F.number(above=0.0, hi=100.0),
    "holdoff_s": F.duration(0.0, 86400.0),
    "fallback_shed_c": _TEMP,
    "include": F.list_of(F.string(max_len=256)),
    "exclude": F.list_of(F.string(max_len=256)),
    "ring_every_s": F.duration(above=0.0, hi=86400.0),
    "state_every_s": F.duration(above=0.0, hi=86400.0),
    "plausible_min_c": _TEMP,
    "plausible_max_c": _TEMP,
    "max_rate_c_per_s": F.number(above=0.0, hi=1e6),
    "critical": F.list_of(F.string(max_len=256)),
    "unreadable_shed_share": F.number(above=0.0, hi=1.0),
    "stuck_after_s": F.duration(above=0.0),
}
_ZONE_FIELDS: F.Schema = {"shed_c": _TEMP, "resume_c": _TEMP}


def load_guard_config(path: Path) -> GuardConfig:
    layers = load_layers(path)
    top = F.check(layers.data, {"guard": F.table(), "zones": F.table()}, layers.locate)
    section = dict(GUARD_DEFAULTS)
    section.update(F.check(top.get("guard", {}), _GUARD_FIELDS, layers.locate, prefix=("guard",)))
    zones = {
        str(name): F.check(per, _ZONE_FIELDS, layers.locate, prefix=("zones", str(name)))
        for name, per in top.get("zones", {}).items()
    }
    cfg = GuardConfig(**{k: section[k] for k in GUARD_DEFAULTS}, zones=zones, files=layers.files)
    if not cfg.plausible_min_c < cfg.plausible_max_c:
        raise layers.error(
            ("guard", "plausible_min_c"),
            "plausible_min_c must be below plausible_max_c",
            hint="the defaults are -40 and 150",
        )
    return cfg
