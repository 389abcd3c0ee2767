"""The fleet's health history: every `alma fleet health` run folded into one SQLite file.

The status page reads it for per-node uptime (24 h / 7 d / 30 d) and the last state changes
(incidents, and the Atom feed). Stdlib ``sqlite3`` only; one transaction per run, so a
killed run leaves the previous history intact. The file names internal nodes: it is kept
private (mode 0600) beside the snapshot and never published; the page shows aliases only.

Uptime is time-weighted: a run's state holds until the next run, but never longer than
``max_gap`` seconds (the panel's staleness limit); time not covered by a run is "no data"
and is left out of the share rather than guessed. Only OK counts as up: WARNING, CRITICAL
and UNKNOWN (unreachable, stale, unparsable) are all time the node was not known good.

Storage is incremental (schema 2), so rendering costs the same after a day or after 90:
each run credits the interval since a node's previous run to hourly rollups (seconds OK /
seconds known per node and hour), keeps each node's last state, and records only state
CHANGES (not every sample). A window's uptime is a sum over at most 24 x 30 rollups per
node (the hour the window starts in is prorated), plus the still-open interval of the
node's last state. A schema-1 file (one row per node per run) is folded into this on first
open, once.

Invariants (tests/fleet/test_history.py):

- A clock cannot erase the history: a run more than ``FUTURE_LIMIT_S`` ahead of this
  machine's wall clock is refused; pruning removes only what is older than ``KEEP_DAYS``
  before the newest *plausible* run. A run more than ``JUMP_S`` after the previous one, or
  before it, starts a new timeline; a timeline prunes only once its runs span
  ``CONFIRM_S`` (so a wall clock that stays wrong for a few runs, not only one, erases
  nothing; after a real gap of days pruning resumes a day later).
- A locked history (another run writing) is waited for (``BUSY_TIMEOUT_S``), then a clear
  "another alma run is writing; retry", never advice to move the file away.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from alma.errors import ConfigError
from alma.fleet.health import FleetReport
from alma.ground import parse_utc, utc_iso

SCHEMA_VERSION = 2
KEEP_DAYS = 90  # older runs, rollups and changes are pruned on append: the file stays bounded
WINDOWS = {"24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0}
BUCKET_S = 3600  # rollup granularity; a window's first hour is prorated
FUTURE_LIMIT_S = 600.0  # a run this far ahead of the wall clock is refused
JUMP_S = 86400.0  # a run this far past the previous one starts a new timeline
CONFIRM_S = 86400.0  # a timeline prunes once its runs span this long
BUSY_TIMEOUT_S = 10.0
DEFAULT_MAX_GAP = 900.0  # the panel's default staleness limit
_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    epoch REAL NOT NULL,
    status TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_epoch ON runs(epoch);
CREATE TABLE IF NOT EXISTS node_state (
    node TEXT PRIMARY KEY,
    epoch REAL NOT NULL,
    status TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollup (
    node TEXT NOT NULL,
    hour INTEGER NOT NULL,
    ok_s REAL NOT NULL,
    known_s REAL NOT NULL,
    PRIMARY KEY (node, hour)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rollup_hour ON rollup(hour);
CREATE TABLE IF NOT EXISTS changes (
    node TEXT NOT NULL,
    epoch REAL NOT NULL,
    before TEXT NOT NULL,
    after TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS changes_epoch ON changes(epoch);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS perf_rollup (
    node TEXT NOT NULL,
    "check" TEXT NOT NULL,
    label TEXT NOT NULL,
    hour INTEGER NOT NULL,
    unit TEXT NOT NULL,
    n INTEGER NOT NULL,
    total REAL NOT NULL,
    lo REAL NOT NULL,
    hi REAL NOT NULL,
    PRIMARY KEY (node, "check", label, hour)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS perf_rollup_hour ON perf_rollup(hour);
CREATE TABLE IF NOT EXISTS perf_series (
    node TEXT NOT NULL,
    "check" TEXT NOT NULL,
    label TEXT NOT NULL,
    last_hour INTEGER NOT NULL,
    PRIMARY KEY (node, "check", label)
) WITHOUT ROWID;
"""
# Tables added within schema 2 (older alma ignores them): created by every writer.
_DDL_ADDED = _DDL[_DDL.index("CREATE TABLE IF NOT EXISTS meta") :]
# Perfdata series per node over the whole retention window (not per run): a node inventing
# new labels every run gets no new series once it has this many, so it cannot bloat the file.
MAX_PERF_SERIES = 200
# Each run's response time per node (connect, read, judge) is kept as a series of its own.
RESPONSE_CHECK, RESPONSE_LABEL = "alma", "response_time"
_STATUSES = ("OK", "WARNING", "CRITICAL", "UNKNOWN")


def default_history_path(snapshot: Path) -> Path:
    return snapshot.with_name("fleet-history.sqlite")


def _locked(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


@contextmanager
def _connect(path: Path, *, create: bool, busy_timeout: float = BUSY_TIMEOUT_S) -> Iterator[sqlite3.Connection]:
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
        with closing(sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, SCHEMA_VERSION):
                raise ConfigError(f"{path}: history schema {version}, this alma knows {SCHEMA_VERSION}",
                                  hint="upgrade alma; the file is left as it is")  # fmt: skip
            if version == 0 and create:
                conn.executescript(_DDL + f"PRAGMA user_version = {SCHEMA_VERSION};")
            elif version == 1:
                _migrate_v1(conn)
            if create:
                conn.executescript(_DDL_ADDED)
            yield conn
    except sqlite3.Error as exc:
        if _locked(exc):
            raise ConfigError(
                f"{path}: another alma run is writing the fleet history; retry",
                hint=f"waited {busy_timeout:g} s for its lock; run again once it is done (nothing was lost)",
            ) from None
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc):
            raise ConfigError(f"{path}: the disk is full: the fleet history was not written",
                              hint=f"free space on the disk of {path.parent}; the file is intact") from exc  # fmt: skip
        raise ConfigError(
            f"{path}: unreadable fleet history: {exc}",
            hint=f"keep a copy of {path} for inspection (sqlite3 {path} .recover), then move it away; "
            "a new one is started",
        ) from exc


class Folder:
    """Folds runs into rollups, states and changes in memory; ``flush`` adds them to the file.

    One run (``append``) or a whole schema-1 file (the upgrade streams its samples through
    one Folder, so memory is one entry per node and hour, never one per sample).
    """

    def __init__(self, last: dict[str, tuple[float, str]], max_gap: float) -> None:
        self.last = dict(last)
        self.max_gap = max_gap
        self.rollup: dict[tuple[str, int], list[float]] = {}
        self.changes: list[tuple[str, float, str, str]] = []
        self.runs: list[tuple[float, str]] = []
        self.touched: set[str] = set()

    def _credit(self, node: str, start: float, end: float, status: str) -> None:
        t = start
        while t < end:
            hour = math.floor(t / BUCKET_S)
            upto = min(end, (hour + 1) * BUCKET_S)
            acc = self.rollup.setdefault((node, hour), [0.0, 0.0])
            acc[1] += upto - t
            if status == "OK":
                acc[0] += upto - t
            t = upto

    def feed(self, epoch: float, status: str, nodes: list[tuple[str, str]]) -> None:
        self.runs.append((epoch, status))
        for node, st in nodes:
            prev = self.last.get(node)
            if prev is not None:
                p_epoch, p_status = prev
                if epoch > p_epoch:
                    self._credit(node, p_epoch, min(epoch, p_epoch + self.max_gap), p_status)
                if p_status != st:
                    self.changes.append((node, epoch, p_status, st))
            self.last[node] = (epoch, st)
            self.touched.add(node)

    def flush(self, conn: sqlite3.Connection) -> None:
        conn.executemany("INSERT INTO runs (epoch, status) VALUES (?, ?)", self.runs)
        conn.executemany(
            "INSERT INTO rollup (node, hour, ok_s, known_s) VALUES (?, ?, ?, ?) ON CONFLICT (node, hour) "
            "DO UPDATE SET ok_s = ok_s + excluded.ok_s, known_s = known_s + excluded.known_s",
            [(n, h, ok, known) for (n, h), (ok, known) in self.rollup.items()],
        )
        conn.executemany("INSERT INTO changes (node, epoch, before, after) VALUES (?, ?, ?, ?)", self.changes)
        conn.executemany(
            "INSERT INTO node_state (node, epoch, status) VALUES (?, ?, ?) ON CONFLICT (node) "
            "DO UPDATE SET epoch = excluded.epoch, status = excluded.status",
            [(n, *self.last[n]) for n in self.touched],
        )


def _prune(conn: sqlite3.Connection, epoch: float) -> None:
    cutoff = epoch - KEEP_DAYS * 86400.0
    conn.execute("DELETE FROM runs WHERE epoch < ?", (cutoff,))
    conn.execute("DELETE FROM changes WHERE epoch < ?", (cutoff,))
    conn.execute("DELETE FROM rollup WHERE hour < ?", (math.floor(cutoff / BUCKET_S),))
    conn.execute("DELETE FROM node_state WHERE epoch < ?", (cutoff,))
    conn.execute("DELETE FROM perf_rollup WHERE hour < ?", (math.floor(cutoff / BUCKET_S),))
    conn.execute("DELETE FROM perf_series WHERE last_hour < ?", (math.floor(cutoff / BUCKET_S),))


def _within_budget(conn: sqlite3.Connection, rows: list[tuple[str, str, str, int, str, float]]) -> list[
        tuple[str, str, str, int, str, float]]:  # fmt: skip
    """The rows whose series the node already has, and new series while the node has fewer
    than MAX_PERF_SERIES in the retention window; the series table follows."""
    if not rows:
        return rows
    if conn.execute("SELECT 1 FROM perf_series LIMIT 1").fetchone() is None:  # written before the budget
        conn.execute('INSERT OR IGNORE INTO perf_series SELECT node, "check", label, MAX(hour) FROM perf_rollup '
                     'GROUP BY node, "check", label')  # fmt: skip
    nodes = sorted({r[0] for r in rows})
    known: set[tuple[str, str, str]] = set()
    count: dict[str, int] = {}
    for i in range(0, len(nodes), 500):  # SQLite's bound-parameter limit
        part = nodes[i : i + 500]
        marks = ",".join("?" * len(part))
        for node, check, label in conn.execute(
                f'SELECT node, "check", label FROM perf_series WHERE node IN ({marks})', part):  # fmt: skip
            known.add((node, check, label))
            count[node] = count.get(node, 0) + 1
    kept = []
    for r in rows:
        key = (r[0], r[1], r[2])
        if key not in known:
            if count.get(r[0], 0) >= MAX_PERF_SERIES:
                continue
            known.add(key)
            count[r[0]] = count.get(r[0], 0) + 1
        kept.append(r)
    conn.executemany('INSERT INTO perf_series (node, "check", label, last_hour) VALUES (?, ?, ?, ?) '
                     'ON CONFLICT (node, "check", label) DO UPDATE SET last_hour = excluded.last_hour',
                     [(r[0], r[1], r[2], r[3]) for r in kept])  # fmt: skip
    return kept


def _perf_rows(report: FleetReport) -> list[tuple[str, str, str, int, str, float]]:
    """(node, check, label, hour, unit, value) for every fresh, finite perfdata value."""
    hour = math.floor(parse_utc(report.time).timestamp() / BUCKET_S)
    out = []
    for n in report.nodes:
        if n.reachable and 0 < n.duration_s < 1e6:  # the check's own response time, first: never out of budget
            out.append((n.name, RESPONSE_CHECK, RESPONSE_LABEL, hour, "s", float(n.duration_s)))
        seen: set[tuple[str, str]] = set()
        for c in n.checks:
            if c.stale:
                continue
            for p in c.perfdata:
                key = (c.name, p.label)
                if p.value is None or not math.isfinite(p.value) or key in seen or len(seen) >= MAX_PERF_SERIES:
                    continue
                seen.add(key)
                out.append((n.name, c.name, p.label, hour, p.uom, float(p.value)))
    return out


def _migrate_v1(conn: sqlite3.Connection) -> None:
    """Schema 1 (runs + one sample row per node and run) -> rollups, states and changes, in
    ONE transaction (SQLite's DDL is transactional): a killed upgrade leaves schema 1."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("DROP INDEX IF EXISTS runs_epoch")
        conn.execute("ALTER TABLE runs RENAME TO runs_v1")
        for stmt in _DDL.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        folder = Folder({}, DEFAULT_MAX_GAP)
        rows = conn.execute(
            "SELECT r.id, r.epoch, r.status, s.node, s.status FROM runs_v1 r LEFT JOIN samples s ON s.run_id = r.id "
            "ORDER BY r.epoch, r.id"
        )
        current: tuple[int, float, str] | None = None
        nodes: list[tuple[str, str]] = []
        for run_id, epoch, status, node, node_status in rows:
            if current is None or current[0] != run_id:
                if current is not None:
                    folder.feed(current[1], current[2], nodes)
                current, nodes = (int(run_id), float(epoch), str(status)), []
            if node is not None:
                nodes.append((str(node), str(node_status)))
        if current is not None:
            folder.feed(current[1], current[2], nodes)
        folder.flush(conn)
        conn.execute("DROP TABLE samples")
        conn.execute("DROP TABLE runs_v1")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def append(
    path: Path, report: FleetReport, *, max_gap: float = DEFAULT_MAX_GAP, wall: Callable[[], float] = time.time,
    busy_timeout: float = BUSY_TIMEOUT_S,
) -> None:  # fmt: skip
    """Fold one run (its time and every node's status) in one transaction; prune old runs.

    Raises ConfigError for a run dated more than FUTURE_LIMIT_S ahead of ``wall()``.
    """
    epoch = parse_utc(report.time).timestamp()
    ahead = epoch - wall()
    if ahead > FUTURE_LIMIT_S:
        raise ConfigError(
            f"{path}: run dated {report.time} is {ahead:.0f} s ahead of this machine's clock; not recorded",
            hint="check the clock (timedatectl); the history keeps its runs",
        )
    nodes = [(n.name, n.status.name) for n in report.nodes]
    with _connect(path, create=True, busy_timeout=busy_timeout) as conn:
        conn.execute("BEGIN IMMEDIATE")  # take the write lock now: wait for it, then fail clearly
        try:
            prev = conn.execute("SELECT epoch FROM runs ORDER BY id DESC LIMIT 1").fetchone()
            row = conn.execute("SELECT value FROM meta WHERE key = 'timeline_start'").fetchone()
            start = float(row[0]) if row else (float(prev[0]) if prev else epoch)
            if prev is not None and not 0 <= epoch - float(prev[0]) <= JUMP_S:
                start = epoch  # a jump (either way): a new timeline, unconfirmed
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('timeline_start', ?)", (start,))
            last = {n: (float(e), str(s)) for n, e, s in conn.execute("SELECT node, epoch, status FROM node_state")}
            folder = Folder(last, max_gap)
            folder.feed(epoch, report.status.name, nodes)
            folder.flush(conn)
            conn.executemany(
                'INSERT INTO perf_rollup (node, "check", label, hour, unit, n, total, lo, hi) '
                'VALUES (?, ?, ?, ?, ?, 1, ?6, ?6, ?6) ON CONFLICT (node, "check", label, hour) DO UPDATE SET '
                "unit = excluded.unit, n = n + 1, total = total + excluded.total, "
                "lo = MIN(lo, excluded.lo), hi = MAX(hi, excluded.hi)",
                _within_budget(conn, _perf_rows(report)),
            )
            if epoch - start >= CONFIRM_S:
                _prune(conn, epoch)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


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
class Series:
    """One perfdata series of a node's check: hourly means over the last ``PERF_HOURS``."""

    check: str
    label: str
    unit: str
    points: list[tuple[int, float]]  # (hour since the epoch, mean of the hour), oldest first
    lo: float
    hi: float
    last: float  # the newest hour's mean


PERF_HOURS = 48


@dataclass
class History:
    nodes: dict[str, NodeHistory]
    changes: list[Change]  # newest first
    runs: int
    perf: dict[str, list[Series]] = field(default_factory=dict)  # node -> series (check, label order)
    node_changes: dict[str, list[Change]] = field(default_factory=dict)  # node -> its own, newest first


# State changes kept per node for its page: its own, however busy the rest of the fleet is.
NODE_CHANGES = 20


def load(path: Path, now: datetime, *, max_gap: float, limit: int = 50) -> History:
    """Uptime per node, the newest ``limit`` state changes of the fleet and the newest
    ``NODE_CHANGES`` of each node from the history file."""
    t_now = now.timestamp()
    now_hour = math.floor(t_now / BUCKET_S)
    sums: dict[str, dict[str, list[float]]] = {}
    with _connect(path, create=False) as conn:
        for name, span in WINDOWS.items():
            start = t_now - span
            first = math.floor(start / BUCKET_S)
            frac = ((first + 1) * BUCKET_S - start) / BUCKET_S  # the share of the first hour inside
            rows = conn.execute(
                "SELECT node, SUM(CASE WHEN hour = ? THEN ok_s * ? ELSE ok_s END), "
                "SUM(CASE WHEN hour = ? THEN known_s * ? ELSE known_s END) "
                "FROM rollup WHERE hour >= ? AND hour < ? GROUP BY node",
                (first, frac, first, frac, first, now_hour),
            )
            for node, ok, known in rows:
                sums.setdefault(str(node), {})[name] = [float(ok or 0), float(known or 0)]
            # The current hour exactly (its rollup holds only closed intervals up to the last run).
            for node, ok, known in conn.execute("SELECT node, ok_s, known_s FROM rollup WHERE hour = ?", (now_hour,)):
                acc = sums.setdefault(str(node), {}).setdefault(name, [0.0, 0.0])
                acc[0] += float(ok)
                acc[1] += float(known)
        states = conn.execute("SELECT node, epoch, status FROM node_state").fetchall()
        change_rows = conn.execute(
            "SELECT node, epoch, before, after FROM changes WHERE epoch <= ? ORDER BY epoch DESC, node LIMIT ?",
            (t_now, limit),
        ).fetchall()
        own_rows = conn.execute(
            "SELECT node, epoch, before, after FROM (SELECT node, epoch, before, after, ROW_NUMBER() OVER "
            "(PARTITION BY node ORDER BY epoch DESC) AS k FROM changes WHERE epoch <= ?) WHERE k <= ? "
            "ORDER BY node, epoch DESC",
            (t_now, NODE_CHANGES),
        ).fetchall()
        runs = int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        perf = _perf_series(conn, now_hour - PERF_HOURS + 1, now_hour)
    for node, epoch, status in states:  # the last state holds until now, at most max_gap
        end = min(t_now, float(epoch) + max_gap)
        for name, span in WINDOWS.items():
            lo = max(float(epoch), t_now - span)
            if end > lo:
                acc = sums.setdefault(str(node), {}).setdefault(name, [0.0, 0.0])
                acc[1] += end - lo
                if status == "OK":
                    acc[0] += end - lo
    nodes = {}
    for node, per in sums.items():
        uptime: dict[str, float | None] = {}
        coverage: dict[str, float] = {}
        for name, span in WINDOWS.items():
            ok, known = per.get(name, [0.0, 0.0])
            known = min(known, span)
            uptime[name] = round(100.0 * min(ok, known) / known, 2) if known > 0 else None
            coverage[name] = round(100.0 * known / span, 1)
        nodes[node] = NodeHistory(node, uptime, coverage)

    def valid(s: str) -> str:
        return s if s in _STATUSES else "UNKNOWN"

    changes = [Change(str(n), utc_iso(float(e)), float(e), valid(b), valid(a)) for n, e, b, a in change_rows]
    own: dict[str, list[Change]] = {}
    for n, e, b, a in own_rows:
        own.setdefault(str(n), []).append(Change(str(n), utc_iso(float(e)), float(e), valid(b), valid(a)))
    return History(nodes, changes, runs, perf, own)


def _perf_series(conn: sqlite3.Connection, first: int, last: int) -> dict[str, list[Series]]:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'perf_rollup'").fetchone() is None:
        return {}  # written by an alma before perfdata history
    out: dict[str, list[Series]] = {}
    rows = conn.execute(
        'SELECT node, "check", label, hour, unit, total / n, lo, hi FROM perf_rollup WHERE hour >= ? AND hour <= ? '
        'ORDER BY node, "check", label, hour',
        (first, last),
    )
    cur: Series | None = None
    cur_node = ""
    for node, check, label, hour, unit, mean, lo, hi in rows:
        if cur is None or (node, check, label) != (cur_node, cur.check, cur.label):
            cur = Series(str(check), str(label), str(unit), [], float(lo), float(hi), float(mean))
            cur_node = str(node)
            out.setdefault(cur_node, []).append(cur)
        cur.points.append((int(hour), float(mean)))
        cur.lo, cur.hi, cur.last, cur.unit = min(cur.lo, float(lo)), max(cur.hi, float(hi)), float(mean), str(unit)
    return out
