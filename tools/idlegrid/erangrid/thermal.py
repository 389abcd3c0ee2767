"""Heat: thermal zones over their limit, or the thermal guard's state says it is shedding.

The guard state (docs/formats.md, "Guard state") older than ``stale_after`` or unreadable is
*unknown*, and unknown pauses work: the guard may be dead, so we fail closed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class Heat:
    hot: bool
    reason: str  # e.g. "tj-thermal 91 °C" or "guard shedding: ..." or "" when cool


def read_zones(thermal: Path = Path("/sys/class/thermal")) -> dict[str, float]:
    """Zone name → °C. Unreadable zones are skipped (reported by the guard, not by us)."""
    zones: dict[str, float] = {}
    base = str(thermal)
    try:
        entries = sorted(n for n in os.listdir(base) if n.startswith("thermal_zone"))
    except OSError:
        return zones
    for zone in entries:
        try:
            with open(f"{base}/{zone}/type") as fh:
                name = fh.read().strip() or zone
            with open(f"{base}/{zone}/temp") as fh:
                zones[name] = int(fh.read().strip()) / 1000.0
        except (OSError, ValueError):
            continue
    return zones


def zone_heat(zones: dict[str, float], default_max: float, per_zone: dict[str, float]) -> Heat:
    worst: tuple[float, str, float] | None = None
    for name, temp in zones.items():
        limit = per_zone.get(name, default_max)
        if temp >= limit and (worst is None or temp - limit > worst[0] - worst[2]):
            worst = (temp, name, limit)
    if worst is None:
        return Heat(False, "")
    return Heat(True, f"{worst[1]} {worst[0]:.0f} °C")


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def guard_heat(path: Path | None, stale_after: float, required: bool, now: float | None = None) -> Heat:
    if path is None:
        return Heat(False, "")
    now = time.time() if now is None else now
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return Heat(True, "thermal guard state missing") if required else Heat(False, "")
    except (OSError, ValueError):
        return Heat(True, "thermal guard state unreadable")
    try:
        if state.get("schema") != "alma.guard-state/1":
            return Heat(True, f"thermal guard state has unknown schema {state.get('schema')!r}")
        age = now - _parse_time(str(state["updated"]))
    except (KeyError, ValueError, AttributeError, TypeError):
        return Heat(True, "thermal guard state unreadable")
    if age > stale_after:
        return Heat(True, f"thermal guard state stale ({age:.0f} s old)")
    if state.get("shedding") is not False:
        return Heat(True, f"guard shedding: {state.get('reason') or 'no reason given'}")
    return Heat(False, "")
