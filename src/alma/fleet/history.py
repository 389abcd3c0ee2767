"""The fleet's health history: every `alma fleet health` run appended to one SQLite file.

The status page reads it for per-node uptime (24 h / 7 d / 30 d) and the last state changes
(incidents, and the Atom feed). Stdlib ``sqlite3`` only; one transaction per run, so a
killed run leaves the previous history intact. The file names internal nodes: it is kept
private (mode 0600) beside the snapshot and never published; the page shows aliases only.

Uptime is time-weighted: a run's state holds until the next run, but never longer than
``max_gap`` seconds (the panel's staleness limit); time not covered by a run is "no data"
and is left out of the share rather than guessed. Only OK counts as up: WARNING, CRITICAL
and UNKNOWN (unreachable, stale, unparsable) are all time the node was not known good.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from alma.errors import ConfigError
from alma.fleet.health import FleetReport
from alma.ground import parse_utc, utc_iso

SCHEMA_VERSION = 1
KEEP_DAYS = 90  # older runs are pruned on append: the file stays bounded
WINDOWS = {"24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0}
_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    epoch REAL NOT NULL,
    status TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_epoch ON runs(epoch);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    node TEXT NOT NULL,
    status TEXT NOT NULL,
    PRIMARY KEY (run_id, node)
);
"""
_STATUSES = ("OK", "WARNING", "CRITICAL", "UNKNOWN")


def default_history_path(snapshot: Path) -> Path:
    return snapshot.with_name("fleet-history.sqlite")


@contextmanager
def _connect(path: Path, *, create: bool) -> Iterator[sqlite3.Connection]:
    if not create and not path.exists():
        raise ConfigError(f"no fleet history at {path}", hint="run `alma fleet health` (it appends to the history)")
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:
            raise ConfigError(f"cannot create the fleet history {path}: {exc.strerror or exc}",
                              hint="pass --history FILE in a writable directory") from exc  # fmt: skip
    try:
        with closing(sqlite3.connect(path, timeout=10)) as conn:
            conn.execute("PRAGMA foreign_keys = ON")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise ConfigError(f"{path}: history schema {version}, this alma knows {SCHEMA_VERSION}",
                                  hint="upgrade alma, or move the file away")  # fmt: skip
            if create and version == 0:
                conn.executescript(_DDL + f"PRAGMA user_version = {SCHEMA_VERSION};")
            yield conn
    except sqlite3.DatabaseError as exc:
        raise ConfigError(
            f"{path}: unreadable fleet history: {exc}", hint=f"move {path} away; a new one is started"
        ) from exc


def append(path: Path, report: FleetReport) -> None:
    """Add one run (its time and every node's status) in one transaction; prune old runs."""
    epoch = parse_utc(report.time).timestamp()
    with _connect(path, create=True) as conn, conn:
        cur = conn.execute("INSERT INTO runs (epoch, status) VALUES (?, ?)", (epoch, report.status.name))
        run_id = cur.lastrowid
        conn.executemany(
            "INSERT OR REPLACE INTO samples (run_id, node, status) VALUES (?, ?, ?)",
            [(run_id, n.name, n.status.name) for n in report.nodes],
        )
        conn.execute("DELETE FROM runs WHERE epoch < ?", (epoch - KEEP_DAYS * 86400.0,))


@dataclass(frozen=True)
class Change:
    """A node's state changed between two runs (an incident starts or ends)."""

    node: str
    time: str  # ISO UTC of the run that saw the new state
    epoch: float
    before: str
    after: str


@dataclass
class NodeHistory:
    node: str
    uptime: dict[str, float | None]  # window -> percent OK of the covered time (None: no data)
    coverage: dict[str, float]  # window -> percent of the window covered by runs


@dataclass
class History:
    nodes: dict[str, NodeHistory]
    changes: list[Change]  # newest first
    runs: int


def _samples(conn: sqlite3.Connection, since: float) -> dict[str, list[tuple[float, str]]]:
    out: dict[str, list[tuple[float, str]]] = {}
    rows = conn.execute(
        "SELECT s.node, r.epoch, s.status FROM samples s JOIN runs r ON r.id = s.run_id "
        "WHERE r.epoch >= ? ORDER BY s.node, r.epoch",
        (since,),
    )
    for node, epoch, status in rows:
        out.setdefault(str(node), []).append((float(epoch), status if status in _STATUSES else "UNKNOWN"))
    return out


def summarise(
    samples: list[tuple[float, str]], now: float, max_gap: float
) -> tuple[dict[str, float | None], dict[str, float]]:
    """Time-weighted OK share and coverage per window (see the module docstring)."""
    uptime: dict[str, float | None] = {}
    coverage: dict[str, float] = {}
    for name, span in WINDOWS.items():
        start = now - span
        ok = known = 0.0
        for i, (t, status) in enumerate(samples):
            end = min(samples[i + 1][0] if i + 1 < len(samples) else now, t + max_gap, now)
            lo = max(t, start)
            if end <= lo:
                continue
            known += end - lo
            if status == "OK":
                ok += end - lo
        uptime[name] = round(100.0 * ok / known, 2) if known > 0 else None
        coverage[name] = round(100.0 * known / span, 1)
    return uptime, coverage


def changes_of(samples: dict[str, list[tuple[float, str]]]) -> list[Change]:
    out = []
    for node, seq in samples.items():
        for (_, before), (t, after) in zip(seq, seq[1:], strict=False):
            if before != after:
                out.append(Change(node, utc_iso(t), t, before, after))
    out.sort(key=lambda c: (-c.epoch, c.node))
    return out


def load(path: Path, now: datetime, *, max_gap: float, limit: int = 50) -> History:
    """Uptime per node and the newest ``limit`` state changes from the history file."""
    t_now = now.timestamp()
    with _connect(path, create=False) as conn:
        samples = _samples(conn, t_now - max(WINDOWS.values()) - max_gap)
        runs = int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    nodes = {}
    for node, seq in samples.items():
        uptime, coverage = summarise(seq, t_now, max_gap)
        nodes[node] = NodeHistory(node, uptime, coverage)
    return History(nodes, changes_of(samples)[:limit], runs)
