"""Configuration of the guard and the health watchdog (TOML, read with tomllib).

``/etc/alma/guard.toml`` then ``/etc/alma/guard.d/*.toml`` in name order (the per-board
measured values go in a drop-in, e.g. ``guard.d/50-board.toml``); the same for health.
A missing file means defaults; a broken one is an error with the file named.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import GuardError
from .thermal import Zone

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
    # The state file is rewritten on change and at least this often (formats.md: 10 s).
    "state_every_s": 5.0,
}


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for key, val in src.items():
        if isinstance(val, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], val)
        else:
            dst[key] = val


def load_toml_layers(main: Path) -> tuple[dict[str, Any], list[Path]]:
    """``main`` plus ``<main stem>.d/*.toml`` merged in order; the files actually read."""
    merged: dict[str, Any] = {}
    used: list[Path] = []
    dropins = sorted((main.parent / f"{main.stem}.d").glob("*.toml")) if main.parent.is_dir() else []
    for path in [main, *dropins]:
        if not path.is_file():
            continue
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise GuardError(
                f"{path}: {exc}", hint=f"fix the TOML in {path} (or move it away to use defaults)"
            ) from exc
        _merge(merged, data)
        used.append(path)
    return merged, used


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
    zones: dict[str, dict[str, float]] = field(default_factory=dict)  # per-zone shed_c/resume_c
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


def load_guard_config(path: Path) -> GuardConfig:
    data, used = load_toml_layers(path)
    section = dict(GUARD_DEFAULTS)
    g = data.get("guard", {})
    if not isinstance(g, dict):
        raise GuardError(f"{path}: [guard] must be a table")
    unknown = set(g) - set(GUARD_DEFAULTS)
    if unknown:
        raise GuardError(
            f"{path}: unknown [guard] key(s): {', '.join(sorted(unknown))}",
            hint="known keys: " + ", ".join(sorted(GUARD_DEFAULTS)),
        )
    section.update(g)
    zones = data.get("zones", {})
    if not isinstance(zones, dict) or not all(isinstance(v, dict) for v in zones.values()):
        raise GuardError(f'{path}: [zones."<type>"] entries must be tables')
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
            zones={str(k): {kk: float(vv) for kk, vv in v.items()} for k, v in zones.items()},
            files=used,
        )
    except (TypeError, ValueError) as exc:
        raise GuardError(
            f"{path}: bad value: {exc}", hint="numbers for *_c and *_s keys, lists for include/exclude"
        ) from exc
    if cfg.interval_s <= 0 or cfg.holdoff_s < 0 or cfg.hysteresis_c <= 0:
        raise GuardError(
            f"{path}: interval_s and hysteresis_c must be > 0, holdoff_s >= 0",
            hint="e.g. interval_s = 1.0, hysteresis_c = 10.0, holdoff_s = 60.0",
        )
    return cfg
