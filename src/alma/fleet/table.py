"""The node x check table of a fleet report, as rows a renderer (rich or plain) prints.

The table's shape is the project's, never a node's: the columns are the project's own check
names (a report inventing checks adds no column), and every cell is cut to a fixed width
with an ellipsis, so a 300-character alias or a 200 KB summary cannot push the columns
off-screen. A stale report's checks read "stale", a check a node did not report "not
reported", both grey.
"""

from __future__ import annotations

from almaboard import text as T

from alma.fleet.health import FleetReport
from alma.fleet.severity import Severity

# green / amber / red / grey: WARNING is not CRITICAL.
COLOUR = {Severity.OK: "green", Severity.WARNING: "dark_orange", Severity.CRITICAL: "red", Severity.UNKNOWN: "grey50"}
MISSING = "not reported"  # a check this node did not report (grey)
STALE = "stale"  # the report is too old to vouch for the check (grey)
NAME_WIDTH = 32  # node names are at most 63 characters (fleet grammar); aliases up to any length
SUMMARY_WIDTH = 100


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def rows(report: FleetReport) -> tuple[list[str], list[list[tuple[str, Severity | None]]]]:
    """Header and rows of (text, severity) cells; severity None = not reported (grey).

    Every cell passes the one sanitizer: names and summaries come from the fleet and the nodes.
    """
    checks = report.check_names()
    header = ["node", "role", "status", *checks, "summary"]
    out = []
    for n in report.nodes:
        by_name = {c.name: c for c in n.checks}
        label = n.name if not n.alias else f"{n.name} ({n.alias})"
        cells: list[tuple[str, Severity | None]] = [(clip(T.terminal(label), NAME_WIDTH), None), (n.role, None)]
        cells.append((n.status.name, n.status))
        for name in checks:
            c = by_name.get(name)
            if c is None:
                cells.append((MISSING, None))
            else:
                cells.append((STALE, None) if c.stale else (c.status.name, c.status))
        cells.append((clip(T.terminal(n.summary), SUMMARY_WIDTH), None))
        out.append(cells)
    return header, out


def plain(report: FleetReport) -> str:
    header, body = rows(report)
    grid = [header, *[[text for text, _ in r] for r in body]]
    widths = [max(len(r[i]) for r in grid) for i in range(len(header) - 1)]
    lines = []
    for r in grid:
        cols = [r[i].ljust(widths[i]) for i in range(len(widths))]
        lines.append("  ".join([*cols, r[-1]]).rstrip())
    lines.append(f"fleet: {report.status.name} (exit {report.exit_code}) at {report.time}")
    return "\n".join(lines)  # every cell was sanitized in rows()


def rich_table(report: FleetReport) -> object:
    from rich.table import Table
    from rich.text import Text

    header, body = rows(report)
    t = Table(title=f"fleet health at {report.time}", title_justify="left")
    for i, h in enumerate(header):
        last = i == len(header) - 1
        # Fixed cells never wrap a word one letter per line: they are cut with an ellipsis.
        t.add_column(h, overflow="ellipsis", no_wrap=not last, max_width=SUMMARY_WIDTH if last else NAME_WIDTH)
    for r in body:
        cells = []
        for i, (text, sev) in enumerate(r):
            if i >= 2 and i < len(r) - 1:
                colour = COLOUR[sev] if sev else "grey50"
                cells.append(Text(text, style=colour))
            else:
                cells.append(Text(text))  # Text, not markup: summaries contain "[N/A]"
        t.add_row(*cells)
    return t
