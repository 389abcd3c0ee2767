"""Configuration of the guard and the health watchdog (TOML, read with tomllib).

``/etc/alma/guard.toml`` then ``/etc/alma/guard.d/*.toml`` in name order (the per-board
measured values go in a drop-in, e.g. ``guard.d/50-board.toml``); the same for health.
A missing file means defaults; a broken one is an error naming ``file:line``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def load_guard_config(path: Path) -> GuardConfig:
    layers = load_layers(path)
    data = layers.data
    section = dict(GUARD_DEFAULTS)
    g = data.get("guard", {})
    if not isinstance(g, dict):
        raise layers.error(("guard",), "[guard] must be a table")
    unknown = sorted(set(g) - set(GUARD_DEFAULTS))
    if unknown:
        raise layers.error(
            ("guard", unknown[0]),
            f"unknown [guard] key(s): {', '.join(unknown)}",
            hint="known keys: " + ", ".join(sorted(GUARD_DEFAULTS)),
        )
    section.update(g)
    zones = data.get("zones", {})
    if not isinstance(zones, dict) or not all(isinstance(v, dict) for v in zones.values()):
        raise layers.error(("zones",), '[zones."<type>"] entries must be tables')
    for key, val in section.items():
        numeric = isinstance(val, (int, float)) and not isinstance(val, bool)
        if key.endswith(("_c", "_s")) and val is not None and not numeric:
            hint = f"e.g. {key} = {GUARD_DEFAULTS[key]}"
            raise layers.error(("guard", key), f"bad value: {key} must be a number, not {val!r}", hint=hint)
    try:
        cfg = GuardConfig(
            interval_s=float(section["interval_s"]),
            slice=str(section["slice"]),
            margin_c=float(section["margin_c"]),
            measured_reset_c=None if section["measured_reset_c"] is None else float(section["measured_reset_c"]),
            hysteresis_c=float(section["hysteresis_c"]),
            holdoff_s=float(section["holdoff_s"]),
            fallback_shed_c=float(section["fallback_shed_c"]),
            include=[str(x) for x in section["include"]],
            exclude=[str(x) for x in section["exclude"]],
            ring_every_s=float(section["ring_every_s"]),
            state_every_s=float(section["state_every_s"]),
            plausible_min_c=float(section["plausible_min_c"]),
            plausible_max_c=float(section["plausible_max_c"]),
            max_rate_c_per_s=float(section["max_rate_c_per_s"]),
            zones={str(k): {kk: float(vv) for kk, vv in v.items()} for k, v in zones.items()},
            critical=[str(x) for x in section["critical"]],
            unreadable_shed_share=float(section["unreadable_shed_share"]),
            stuck_after_s=float(section["stuck_after_s"]),
            files=layers.files,
        )
    except (TypeError, ValueError) as exc:
        raise GuardError(
            f"{layers.where('guard')}: bad value: {exc}",
            hint="numbers for *_c and *_s keys, lists for include/exclude",
        ) from exc
    if cfg.interval_s <= 0 or cfg.holdoff_s < 0 or cfg.hysteresis_c <= 0:
        bad = "interval_s" if cfg.interval_s <= 0 else "holdoff_s" if cfg.holdoff_s < 0 else "hysteresis_c"
        raise layers.error(
            ("guard", bad),
            "interval_s and hysteresis_c must be > 0, holdoff_s >= 0",
            hint="e.g. interval_s = 1.0, hysteresis_c = 10.0, holdoff_s = 60.0",
        )
    if not 0.0 < cfg.unreadable_shed_share <= 1.0 or not isinstance(section["critical"], list):
        raise layers.error(
            ("guard", "unreadable_shed_share"),
            "unreadable_shed_share must be in (0, 1] and critical a list of zone type globs",
            hint='e.g. unreadable_shed_share = 0.5, critical = ["tj-thermal"]',
        )
    if not cfg.plausible_min_c < cfg.plausible_max_c or cfg.max_rate_c_per_s <= 0:
        raise layers.error(
            ("guard", "plausible_min_c"),
            "plausible_min_c must be below plausible_max_c and max_rate_c_per_s > 0",
            hint="the defaults are -40, 150 and 50",
        )
    return cfg
