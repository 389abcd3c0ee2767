"""The node x check table of a fleet report, as rows a renderer (rich or plain) prints."""

from __future__ import annotations

from almaboard import text as T

from alma.fleet.health import FleetReport
from alma.fleet.severity import Severity

# green / red / grey, the only three colours the operator has to read.
COLOUR = {Severity.OK: "green", Severity.WARNING: "red", Severity.CRITICAL: "red", Severity.UNKNOWN: "grey50"}
MISSING = "-"  # a check this node did not report (grey)


def rows(report: FleetReport) -> tuple[list[str], list[list[tuple[str, Severity | None]]]]:
    """Header and rows of (text, severity) cells; severity None = not reported (grey).

    Every cell passes the one sanitizer: check names and summaries come from the nodes.
    """
    checks = report.check_names()
    header = [T.terminal(h) for h in ("node", "role", "status", *checks, "summary")]
    out = []
    for n in report.nodes:
        by_name = {c.name: c for c in n.checks}
        cells: list[tuple[str, Severity | None]] = [(T.terminal(n.name), None), (n.role, None)]
        cells.append((n.status.name, n.status))
        for name in checks:
            c = by_name.get(name)
            cells.append((c.status.name, c.status) if c else (MISSING, None))
        cells.append((T.terminal(n.summary), None))
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
    for h in header:
        t.add_column(h, overflow="fold")
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
