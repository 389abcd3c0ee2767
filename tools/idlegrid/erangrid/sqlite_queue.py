"""The embedded queue: SQLite, one file, leases.

Durability: WAL with ``synchronous=FULL`` (a commit is on disk when it returns). Every write
runs in ``BEGIN IMMEDIATE`` so two agents never both think they won. A claim is one
``UPDATE … RETURNING`` (SQLite ≥ 3.35). A running job's lease is extended by heartbeats; a
lease that runs out (the agent crashed, the board lost power) puts the job back in the queue.
Yields are counted apart from failures: a job preempted a hundred times is never dead-lettered.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from .errors import CoordinatorUnreachable, NoAccess, UserError
from .jobs import Job, Lease, Outcome, job_id_problem, validate_command

SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26


class QueueCorrupt(UserError):
    """The queue file is not a usable SQLite database (exit 2: restarting will not fix it)."""


def corrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    return type(exc) is sqlite3.DatabaseError


def repair(path: Path, stamp: str) -> Path | None:
    """Move a corrupt queue (and its -wal/-shm) aside to ``<name>.corrupt-<stamp>``; None when
    the file checks out (nothing is moved). Only `eran-grid queue repair` calls this."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            ok = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        finally:
            db.close()
    except sqlite3.Error as exc:
        if not corrupt(exc):
            raise UserError(
                f"cannot check {path}: {exc}", hint="stop the agent first: systemctl stop eran-grid"
            ) from exc
        ok = False
    if ok:
        return None
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        src = path.with_name(path.name + suffix)
        if src.exists():
            src.rename(target.with_name(target.name + suffix))
    return target


MIN_SQLITE = (3, 35, 0)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL DEFAULT '',
    command TEXT NOT NULL,
    input BLOB NOT NULL DEFAULT x'',
    want_checkpoint INTEGER NOT NULL DEFAULT 1,
    state TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'leased', 'done', 'dead')),
    priority INTEGER NOT NULL DEFAULT 0,
    submitted REAL NOT NULL,
    not_before REAL NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_token TEXT,
    lease_expires REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    yields INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    checkpoint BLOB,
    result BLOB,
    exit_code INTEGER,
    detail TEXT NOT NULL DEFAULT '',
    finished REAL
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (state, priority DESC, id);
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs (state, lease_expires);
"""


def parse_command(raw: object) -> tuple[list[str] | None, str]:
    """A row's ``command`` column as an argv, or None and why not (rows are hostile input:
    another program, an old version or a hand edit may have written anything)."""
    if not isinstance(raw, str):
        return None, f"command is {type(raw).__name__}, not JSON text"
    try:
        value = json.loads(raw)
    except ValueError:
        return None, f"command is not JSON: {raw[:60]!r}"
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        return None, f"command must be a non-empty list of non-empty strings, not {raw[:60]}"
    return value, ""


def _job_from_row(row: tuple[Any, ...]) -> tuple[Job | None, str]:
    why = job_id_problem(str(row[0]))
    if why:
        return None, why
    command, why = parse_command(row[2])
    if command is None:
        return None, why
    if not isinstance(row[3], bytes | type(None)):
        return None, f"input is {type(row[3]).__name__}, not a blob"
    if not isinstance(row[1], str | type(None)):
        return None, f"name is {type(row[1]).__name__}, not text"
    return (
        Job(
            id=str(row[0]),
            name=row[1] or "",
            command=command,
            input=bytes(row[3] or b""),
            checkpoint=bool(row[4]),
            yields=int(row[5] or 0),
            failures=int(row[6] or 0),
            attempts=int(row[7] or 0),
        ),
        "",
    )


def check_sqlite_version(version: str = sqlite3.sqlite_version) -> None:
    have = tuple(int(p) for p in version.split(".")[:3])
    if have < MIN_SQLITE:
        raise UserError(
            f"SQLite {version} is too old: the queue claims with UPDATE … RETURNING (3.35+)",
            hint="use the NATS backend, or a newer SQLite",
        )


class SqliteQueue:
    def __init__(
        self,
        path: Path,
        max_failures: int = 3,
        lease_ttl: float = 30.0,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
        backoff: float = 5.0,
    ) -> None:
        check_sqlite_version()
        self.path = Path(path)
        self.max_failures = max_failures
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.busy_timeout = busy_timeout
        self.backoff = backoff
        self._db: sqlite3.Connection | None = None
        self._idle_version: int | None = None  # data_version when a claim last found nothing
        self._next_due = float("inf")

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self._check_access()
            if not self.path.parent.is_dir():
                raise CoordinatorUnreachable(
                    f"queue directory {self.path.parent} does not exist", hint=f"try: mkdir -p {self.path.parent}"
                )
            try:
                db = sqlite3.connect(
                    self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
                )
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
                db.executescript(SCHEMA)
            except sqlite3.Error as exc:
                raise self._error(exc, "cannot open queue ") from exc
            self._db = db
        return self._db

    def _check_access(self) -> None:
        """A user who may not open the queue gets the reason and what to run instead, never a
        traceback: under the shipped unit (DynamicUser=) /var/lib/eran-grid is a link into
        /var/lib/private/, 0700 root's, and the queue is the agent's (UMask=0077)."""
        parent = self.path.parent
        try:
            os.stat(parent)
            ok = not parent.is_dir() or (
                os.access(parent, os.W_OK | os.X_OK)
                and (not self.path.exists() or os.access(self.path, os.R_OK | os.W_OK))
            )
        except (FileNotFoundError, NotADirectoryError):
            return  # a missing directory: _connect says so
        except PermissionError:
            ok = False
        if not ok:
            raise NoAccess(
                f"cannot open the queue {self.path}: it is the agent's, and this user may not read or write it",
                hint="run the same eran-grid command as root (sudo eran-grid ...); "
                "`eran-grid status` works as any user",
            )

    def _error(self, exc: sqlite3.Error, before: str = "", after: str = "") -> Exception:
        """A corrupt file is the operator's to fix (exit 2, never a restart loop); anything
        else (locked, I/O) is the queue being unreachable for now (exit 4, retried)."""
        if corrupt(exc):
            return QueueCorrupt(
                f"queue {self.path} is corrupt: {exc}",
                hint=f"try: eran-grid queue repair --queue-path {self.path} (moves it aside to"
                " queue.db.corrupt-<stamp>; a new, empty queue is created at the next start)",
            )
        return CoordinatorUnreachable(f"{before or 'queue '}{self.path}{after}: {exc}")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._idle_version = None  # our own writes don't move data_version: forget the shortcut
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._error(exc, "", " is not writable") from exc
        try:
            yield db
        except BaseException as exc:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from exc
            raise
        else:
            try:
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._error(exc) from exc

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- administration ---------------------------------------------------------------------
    def submit(
        self, command: list[str], input: bytes = b"", name: str = "", checkpoint: bool = True, priority: int = 0
    ) -> str:
        validate_command(command)
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO jobs (name, command, input, want_checkpoint, priority, submitted) VALUES (?,?,?,?,?,?)",
                (name, json.dumps(command), input, int(checkpoint), priority, self.clock()),
            )
        return str(cur.lastrowid)

    def jobs(self, states: tuple[str, ...] = ("queued", "leased", "done", "dead")) -> list[dict[str, Any]]:
        with self._errors():
            db = self._connect()
            marks = ",".join("?" * len(states))
            rows = db.execute(
                f"SELECT id, name, command, state, priority, submitted, lease_owner, lease_expires, attempts, yields,"
                f" failures, exit_code, detail, finished, length(checkpoint), length(result) FROM jobs"
                f" WHERE state IN ({marks}) ORDER BY id",
                states,
            ).fetchall()
            keys = (
                "id",
                "name",
                "command",
                "state",
                "priority",
                "submitted",
                "lease_owner",
                "lease_expires",
                "attempts",
                "yields",
                "failures",
                "exit_code",
                "detail",
                "finished",
                "checkpoint_bytes",
                "result_bytes",
            )
            out = []
            for row in rows:
                item = dict(zip(keys, row, strict=True))
                item["id"] = str(item["id"])
                command, _why = parse_command(item["command"])
                # A malformed row is listed as it is (its detail says why it is dead), never a crash.
                item["command"] = command if command is not None else [repr(item["command"])[:200]]
                item["name"] = item["name"] if isinstance(item["name"], str) else repr(item["name"])
                item["detail"] = item["detail"] if isinstance(item["detail"], str) else repr(item["detail"])
                out.append(item)
            return out

    def result(self, job_id: str) -> tuple[str, bytes | None, int | None, str]:
        with self._errors():
            row = (
                self._connect()
                .execute("SELECT state, result, exit_code, detail FROM jobs WHERE id=?", (job_id,))
                .fetchone()
            )
            if row is None:
                raise UserError(f"no job {job_id} in {self.path}", hint="try: eran-grid queue list")
            return row[0], row[1], row[2], row[3]

    def counts(self) -> dict[str, int]:
        with self._errors():
            rows = self._connect().execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
            return {"queued": 0, "leased": 0, "done": 0, "dead": 0} | {s: n for s, n in rows}

    def requeue(self, job_id: str) -> None:
        """Put a dead job back (failures reset): the operator fixed the cause."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET state='queued', failures=0, not_before=0, detail='' WHERE id=? AND state='dead'",
                (job_id,),
            )
        if cur.rowcount != 1:
            raise UserError(f"job {job_id} is not dead-lettered", hint="try: eran-grid queue list --state dead")

    def remove(self, job_id: str) -> None:
        with self._tx() as db:
            cur = db.execute("DELETE FROM jobs WHERE id=? AND state IN ('queued','done','dead')", (job_id,))
        if cur.rowcount != 1:
            raise UserError(
                f"job {job_id} does not exist or is running now",
                hint="a leased job cannot be removed; wait for it or stop its agent",
            )

    # -- the agent's side -------------------------------------------------------------------
    def open(self, node: str) -> int:
        """Release our own leases left by a previous run of this node (it crashed or the board
        rebooted): the jobs go back to the queue now instead of after the lease runs out. The
        lost attempt counts as a failure (it ended without a result or a yield)."""
        with self._tx() as db:
            self._reap(db)
            n = self._fail_leases(
                db, "lease_owner=?", (node,), "released at agent start (previous run of this node ended mid-job)"
            )
        return n

    def ping(self) -> None:
        try:
            self._connect().execute("SELECT 1 FROM jobs LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _reap(self, db: sqlite3.Connection) -> None:
        self._fail_leases(db, "lease_expires < ?", (self.clock(),), "lease expired (agent crashed or lost the queue)")

    def _fail_leases(self, db: sqlite3.Connection, where: str, args: tuple[object, ...], detail: str) -> int:
        """Requeue leased jobs matching ``where`` as a lost attempt (a failure, never a yield)."""
        cur = db.execute(
            "UPDATE jobs SET state = CASE WHEN failures + 1 >= ? THEN 'dead' ELSE 'queued' END,"
            " failures = failures + 1, lease_owner=NULL, lease_token=NULL, lease_expires=NULL, detail=?"
            f" WHERE state='leased' AND {where}",
            (self.max_failures, detail, *args),
        )
        return cur.rowcount

    def claim(self, node: str) -> Lease | None:
        now = self.clock()
        token = secrets.token_hex(8)
        try:
            db = self._connect()
            # After an empty claim nothing becomes claimable until another connection commits
            # (data_version moves) or a lease/back-off runs out: skip the write transaction.
            if (
                self._idle_version is not None
                and now < self._next_due
                and db.execute("PRAGMA data_version").fetchone()[0] == self._idle_version
            ):
                return None
            self._idle_version = None
            with self._tx() as db:
                self._reap(db)
                while True:
                    row = db.execute(
                        "UPDATE jobs SET state='leased', lease_owner=?, lease_token=?, lease_expires=?,"
                        " attempts=attempts+1"
                        " WHERE id = (SELECT id FROM jobs WHERE state='queued' AND not_before <= ?"
                        "             ORDER BY priority DESC, id LIMIT 1)"
                        " RETURNING id, name, command, input, want_checkpoint, yields, failures, attempts, checkpoint",
                        (node, token, now + self.lease_ttl, now),
                    ).fetchone()
                    if row is None:
                        break
                    job, why = _job_from_row(row)
                    if job is not None:
                        break
                    # A row no agent can run: dead-letter it now, with the reason, and claim
                    # the next one (never crash, never let it hold the queue up).
                    db.execute(
                        "UPDATE jobs SET state='dead', lease_owner=NULL, lease_token=NULL, lease_expires=NULL,"
                        " finished=?, detail=? WHERE id=?",
                        (now, f"malformed row: {why}", row[0]),
                    )
            if row is None:
                self._idle_version = db.execute("PRAGMA data_version").fetchone()[0]
                due = db.execute(
                    "SELECT min(t) FROM (SELECT min(lease_expires) AS t FROM jobs WHERE state='leased'"
                    " UNION ALL SELECT min(not_before) FROM jobs WHERE state='queued')"
                ).fetchone()[0]
                self._next_due = float(due) if due is not None else float("inf")
                return None
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        assert job is not None
        checkpoint = row[8] if isinstance(row[8], bytes) or row[8] is None else None
        return Lease(job=job, token=token, checkpoint=checkpoint)

    def _owned(self, db: sqlite3.Connection, sql: str, args: tuple[Any, ...], lease: Lease) -> bool:
        cur = db.execute(sql + " WHERE id=? AND state='leased' AND lease_token=?", (*args, lease.job.id, lease.token))
        return cur.rowcount == 1

    def heartbeat(self, lease: Lease, checkpoint: bytes | None) -> bool:
        try:
            with self._tx() as db:
                if checkpoint is not None:
                    return self._owned(
                        db,
                        "UPDATE jobs SET lease_expires=?, checkpoint=?",
                        (self.clock() + self.lease_ttl, checkpoint),
                        lease,
                    )
                return self._owned(db, "UPDATE jobs SET lease_expires=?", (self.clock() + self.lease_ttl,), lease)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def complete(self, lease: Lease, outcome: Outcome) -> bool:
        """Record the result once: only the lease holder can, so a job whose lease expired and
        was claimed again elsewhere cannot end twice."""
        try:
            with self._tx() as db:
                return self._owned(
                    db,
                    "UPDATE jobs SET state=?, result=?, exit_code=?, detail=?, finished=?, lease_owner=NULL,"
                    " lease_token=NULL, lease_expires=NULL",
                    (outcome.status, outcome.result, outcome.exit_code, outcome.detail, self.clock()),
                    lease,
                )
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def yield_(self, lease: Lease, checkpoint: bytes | None) -> None:
        try:
            with self._tx() as db:
                self._owned(
                    db,
                    "UPDATE jobs SET state='queued', yields=yields+1, lease_owner=NULL, lease_token=NULL,"
                    " lease_expires=NULL, checkpoint=coalesce(?, checkpoint), detail='yielded to owner'",
                    (checkpoint,),
                    lease,
                )
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def fail(self, lease: Lease, error: str, checkpoint: bytes | None) -> str:
        backoff = min(300.0, self.backoff * 2**lease.job.failures)
        try:
            with self._tx() as db:
                self._owned(
                    db,
                    "UPDATE jobs SET state = CASE WHEN failures + 1 >= ? THEN 'dead' ELSE 'queued' END,"
                    " failures=failures+1, lease_owner=NULL, lease_token=NULL, lease_expires=NULL,"
                    " not_before=?, detail=?, checkpoint=coalesce(?, checkpoint)",
                    (self.max_failures, self.clock() + backoff, error[-2000:], checkpoint),
                    lease,
                )
                row = db.execute("SELECT state FROM jobs WHERE id=?", (lease.job.id,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return str(row[0]) if row else "queued"
