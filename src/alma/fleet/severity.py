"""Nagios severities and their worst-of ordering.

Exit codes follow the Nagios/monitoring-plugins convention (0 OK, 1 WARNING, 2 CRITICAL,
3 UNKNOWN), but "worst" is NOT the numeric maximum: OK < UNKNOWN < WARNING < CRITICAL, so a
fleet with one CRITICAL node and one unreachable node is CRITICAL (exit 2), not UNKNOWN (3).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Severity(Enum):
    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def code(self) -> int:
        return self.value

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def parse(cls, value: object) -> Severity:
        if isinstance(value, str):
            found = _BY_NAME.get(value) or _BY_NAME.get(value.upper())
            if found is not None:
                return found
        raise ValueError(f"not a Nagios status: {value!r}")


_RANK = {Severity.OK: 0, Severity.UNKNOWN: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}
_BY_NAME = {s.name: s for s in Severity}
_WORST_FIRST = sorted(Severity, key=lambda s: -_RANK[s])


def worst(severities: Iterable[Severity]) -> Severity:
    """The worst severity (OK for an empty input); linear, one set of at most four."""
    seen = set(severities)
    return next((s for s in _WORST_FIRST if s in seen), Severity.OK)
