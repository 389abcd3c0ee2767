"""Nagios/monitoring-plugins conventions: states, worst-of ordering, thresholds, perfdata, the line.

Thresholds have one source: a check decides its state with :func:`level` and publishes the
same numbers in its :class:`Perf`, so a grapher's warn/crit lines are where the check
really alerts (plugin guidelines: ``N`` alerts above N, ``N:`` below N). Every piece of
text (summaries carry kernel-log lines and the guard's reason) goes through the board
library's one sanitizer: one first line, at most one ``|``, values in plain decimal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from almaboard import text

OK, WARNING, CRITICAL, UNKNOWN = "OK", "WARNING", "CRITICAL", "UNKNOWN"
CODES = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}
# Worst-of is not the numeric maximum: UNKNOWN (3) ranks below WARNING (1).
RANK = {OK: 0, UNKNOWN: 1, WARNING: 2, CRITICAL: 3}


def worst(states: list[str]) -> str:
    return max(states, key=lambda s: RANK[s], default=OK)


def level(value: float, warn: float | None, crit: float | None, *, low: bool = False) -> str:
    """The state for ``value`` against thresholds, exactly as :meth:`Perf.render` publishes them.

    Upper bounds alert when the value is ABOVE the threshold, lower bounds (``low``) when it
    is BELOW (the guidelines' ``N`` and ``N:`` ranges, endpoints inclusive of "ok").
    """

    def beyond(t: float | None) -> bool:
        return t is not None and (value < t if low else value > t)

    if beyond(crit):
        return CRITICAL
    if beyond(warn):
        return WARNING
    return OK


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
            "low": self.low,
        }

    def render(self) -> str | None:
        """``'label'=value[UOM];warn;crit;min;max``; None when the value is not a sane number."""
        return text.perf_item(self.label, self.value, self.uom, self.warn, self.crit, self.min, self.max, low=self.low)

    def state(self) -> str:
        """What these thresholds say about this value (the check's own verdict, one source)."""
        return level(self.value, self.warn, self.crit, low=self.low)


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
    summary = "; ".join(f"{c.name} {c.status}: {c.summary}" for c in bad) if bad else "all checks OK"
    perf = " ".join(item for c in checks for p in c.perfdata if (item := p.render()) is not None)
    first = f"{service} {overall} - {text.nagios_text(summary)}" + (f" | {perf}" if perf else "")
    rest = [text.nagios_text(f"{c.name} {c.status}: {c.summary}") for c in checks]
    return "\n".join([first, *rest])
