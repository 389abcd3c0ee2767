"""Nagios/monitoring-plugins conventions: states, worst-of ordering, perfdata, the line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK, WARNING, CRITICAL, UNKNOWN = "OK", "WARNING", "CRITICAL", "UNKNOWN"
CODES = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}
# Worst-of is not the numeric maximum: UNKNOWN (3) ranks below WARNING (1).
RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, CRITICAL: 3}


def worst(states: list[str]) -> str:
    return max(states, key=lambda s: RANK[s], default=OK)


@dataclass
class Perf:
    label: str
    value: float
    uom: str = ""
    warn: float | None = None
    crit: float | None = None
    min: float | None = None
    max: float | None = None
    low: bool = False  # thresholds are lower bounds (alert when the value falls below)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "value": self.value,
            "uom": self.uom,
            "warn": self.warn,
            "crit": self.crit,
            "min": self.min,
            "max": self.max,
        }

    def render(self) -> str:
        """``'label'=value[UOM];warn;crit;min;max`` (lower-bound thresholds as ``N:`` ranges)."""

        def num(v: float | None, rng: bool = False) -> str:
            if v is None:
                return ""
            s = f"{v:g}" if isinstance(v, float) else str(v)
            return f"{s}:" if rng and self.low else s

        label = self.label.replace("'", "_").replace("=", "_")
        value = f"{self.value:g}" if isinstance(self.value, float) else str(self.value)
        return (
            f"'{label}'={value}{self.uom};{num(self.warn, True)};{num(self.crit, True)};{num(self.min)};{num(self.max)}"
        )


@dataclass
class Check:
    name: str
    status: str
    summary: str
    perfdata: list[Perf] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "perfdata": [p.to_json() for p in self.perfdata],
        }


def status_line(checks: list[Check], service: str = "ALMA-HEALTH") -> str:
    """First line + perfdata, then one long-output line per check (Nagios multi-line)."""
    overall = worst([c.status for c in checks])
    bad = [c for c in checks if c.status != OK]
    bad.sort(key=lambda c: -RANK[c.status])
    text = "; ".join(f"{c.name} {c.status}: {c.summary}" for c in bad) if bad else "all checks OK"
    perf = " ".join(p.render() for c in checks for p in c.perfdata)
    first = f"{service} {overall} - {text}" + (f" | {perf}" if perf else "")
    rest = [f"{c.name} {c.status}: {c.summary}" for c in checks]
    return "\n".join([first, *rest])
