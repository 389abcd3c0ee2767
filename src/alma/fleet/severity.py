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
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ValueError(f"not a Nagios status: {value!r}")


_RANK = {Severity.OK: 0, Severity.UNKNOWN: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}


def worst(severities: Iterable[Severity]) -> Severity:
    """The worst severity (OK for an empty input)."""
    out = Severity.OK
    for s in severities:
        if s.rank > out.rank:
            out = s
    return out
