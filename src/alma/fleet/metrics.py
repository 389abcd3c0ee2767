"""`alma fleet health --prometheus FILE`: the run as Prometheus metrics (text exposition
format 0.0.4, as node_exporter's textfile collector reads ``*.prom`` files), written
atomically so the collector never reads half a file.

One gauge per node state and per node x check state (Nagios codes, plus ``stale``), the
response time, and every perfdata value as ``alma_perfdata{node,check,label,unit}``. Label
values come from nodes: they pass the one sanitizer, then the format's escaping (``\\``,
``"``, newline); a non-finite value is left out; at most ``MAX_PERF_PER_NODE`` perfdata
series per node, so a node cannot blow up the collector's cardinality. Two series that
become the same after sanitizing (``disk\u202e`` and ``disk<U+202E>``) are ONE line: the worst
state (or the first value) is kept and the collision counted in ``alma_series_collisions``
(per metric), never a duplicate line that Prometheus or node_exporter would drop at random.
The file names internal nodes: it is for the operator's own Prometheus, never published by
`alma panel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from almaboard import text as T

from alma.fleet.health import FleetReport
from alma.fleet.severity import Severity
from alma.ground import parse_utc, write_atomic

MAX_PERF_PER_NODE = 200


@dataclass
class PublicNode:
    """One node as the public panel shows it."""

    alias: str
    role: str
    code: int
    checks: list[tuple[str, str, int]]  # (check, page word, Nagios code)
    uptime: dict[str, float | None]
    perf: list[tuple[str, str, str, float]]  # (check, label, unit, value)


def _label(v: object) -> str:
    return T.terminal(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv: object) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kv.items()) + "}"


def _state_rank(code: float) -> int:
    """Worst-of order of a Nagios code (CRITICAL over WARNING over UNKNOWN over OK)."""
    return Severity(int(code)).rank if code in (0, 1, 2, 3) else -1


def _family(lines: list[str], name: str, help_text: str, samples: list[tuple[str, float]],
            collisions: dict[str, int] | None = None, states: bool = False) -> None:  # fmt: skip
    """One gauge family, each label set once: on a collision the worst state (``states``) or
    the first value is kept, and the collision counted in ``collisions[name]``."""
    kept: dict[str, float] = {}
    for labels, value in samples:
        if not math.isfinite(value):
            continue
        if labels in kept:
            if collisions is not None:
                collisions[name] = collisions.get(name, 0) + 1
            if states and _state_rank(value) > _state_rank(kept[labels]):
                kept[labels] = value
            continue
        kept[labels] = value
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} gauge")
    lines.extend(f"{name}{labels} {value:.17g}" for labels, value in kept.items())


def _collisions(lines: list[str], name: str, collisions: dict[str, int]) -> None:
    _family(lines, name, "Series that were the same as another after sanitizing (one kept: the worst state "
            "or the first value); a node or check name to fix.",
            [(_labels(metric=m), float(c)) for m, c in sorted(collisions.items())])  # fmt: skip


def exposition(report: FleetReport) -> str:
    lines: list[str] = []
    collisions: dict[str, int] = {}

    def family(name: str, help_text: str, samples: list[tuple[str, float]], states: bool = False) -> None:
        _family(lines, name, help_text, samples, collisions, states)

    family("alma_fleet_status", "Worst node state, Nagios code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).",
           [("", float(report.exit_code))])  # fmt: skip
    family("alma_fleet_run_timestamp_seconds", "When this fleet health run was taken (Unix time).",
           [("", parse_utc(report.time).timestamp())])  # fmt: skip
    family("alma_node_status", "Node state, Nagios code (3 UNKNOWN: unreachable, stale or unparsable).",
           [(_labels(node=n.name, role=n.role), float(n.status.code)) for n in report.nodes], states=True)  # fmt: skip
    family("alma_node_reachable", "1 when ssh reached the node and it answered.",
           [(_labels(node=n.name), float(n.reachable)) for n in report.nodes])  # fmt: skip
    family("alma_node_response_seconds", "Seconds to connect, read and judge the node's report.",
           [(_labels(node=n.name), n.duration_s) for n in report.nodes])  # fmt: skip
    family("alma_check_status", "Check state, Nagios code; stale=\"true\": the report was too old to vouch for it.",
           [(_labels(node=n.name, check=c.name, stale=str(c.stale).lower()), float(c.status.code))
            for n in report.nodes for c in n.checks], states=True)  # fmt: skip
    perf = []
    for n in report.nodes:
        seen: set[tuple[str, str]] = set()
        for c in n.checks:
            for p in c.perfdata:
                key = (c.name, p.label)
                if p.value is None or key in seen or len(seen) >= MAX_PERF_PER_NODE:
                    continue
                seen.add(key)
                perf.append((_labels(node=n.name, check=c.name, label=p.label, unit=p.uom), p.value))
    family("alma_perfdata", "A check's performance value as the node reported it (unit in the unit label).", perf)
    _collisions(lines, "alma_series_collisions", collisions)
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, report: FleetReport) -> None:
    """Atomically (temp file + rename): the textfile collector must never see half a file."""
    write_atomic(path, exposition(report))


def public_exposition(
    *, data_epoch: float, stale: bool, overall_code: int, nodes: list[PublicNode]
) -> str:  # fmt: skip
    """`alma panel`'s ``/metrics``: the PUBLIC state (aliases, never node names; the project's
    check names; perfdata of the fixed grammar the page shows), the same format as above.
    States of stale data are reported as UNKNOWN (3), as the page shows them."""
    lines: list[str] = []
    collisions: dict[str, int] = {}
    _family(lines, "alma_panel_data_timestamp_seconds", "When the published data was taken (Unix time).",
            [("", data_epoch)])  # fmt: skip
    _family(lines, "alma_panel_stale", "1 when the published data is older than the page's limit (or from the future).",
            [("", float(stale))])  # fmt: skip
    _family(lines, "alma_panel_fleet_status", "Worst node state, Nagios code (3 UNKNOWN when stale).",
            [("", 3.0 if stale else float(overall_code))])  # fmt: skip
    _family(lines, "alma_panel_node_status", "Node state by public alias, Nagios code.",
            [(_labels(node=n.alias, role=n.role), 3.0 if stale else float(n.code)) for n in nodes],
            collisions, states=True)  # fmt: skip
    _family(lines, "alma_panel_check_status",
            "Check state, Nagios code; state is the page's word (stale, not reported: 3).",
            [(_labels(node=n.alias, check=c, state=word), 3.0 if stale else float(code))
             for n in nodes for c, word, code in n.checks], collisions, states=True)  # fmt: skip
    _family(lines, "alma_panel_uptime_ratio", "Share of the checked time the node was OK (0..1), per window.",
            [(_labels(node=n.alias, window=w), v / 100.0) for n in nodes for w, v in n.uptime.items()
             if v is not None], collisions)  # fmt: skip
    _family(lines, "alma_panel_perfdata", "A check's performance value (unit in the unit label).",
            [(_labels(node=n.alias, check=c, label=lab, unit=u), v)
             for n in nodes for c, lab, u, v in n.perf], collisions)  # fmt: skip
    _collisions(lines, "alma_panel_series_collisions", collisions)
    return "\n".join(lines) + "\n"
