"""The SQLite lease queue on its own: durable pragmas, one claim per job across processes,
leases that expire into requeues, yields that never dead-letter, results only from the
lease holder, and checkpoints that cannot escape their directory."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
from erangrid.errors import UserError
from erangrid.jobs import Outcome, pack_checkpoint, unpack_checkpoint
from erangrid.sqlite_queue import SqliteQueue, check_sqlite_version


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_durable_pragmas(tmp_path):
    q = SqliteQueue(tmp_path / "q.db")
    q.submit(["true"])
    db = sqlite3.connect(tmp_path / "q.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert q._connect().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_sqlite_version_gate():
    check_sqlite_version()  # this machine's SQLite has RETURNING
    with pytest.raises(UserError, match="3.35"):
        check_sqlite_version("3.34.1")


CLAIMER = """
import json, sys
sys.path.insert(0, {tools!r})
from erangrid.jobs import Outcome
from erangrid.sqlite_queue import SqliteQueue
q = SqliteQueue({path!r})
got = []
while (lease := q.claim({node!r})) is not None:
    got.append(lease.job.id)
    q.complete(lease, Outcome("done", b"", 0))
print(json.dumps(got))
"""


def test_each_job_is_claimed_exactly_once_across_processes(tmp_path, idlegrid_path):
    path = str(tmp_path / "q.db")
    q = SqliteQueue(path)
    ids = {q.submit(["true"], name=str(i)) for i in range(150)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER.format(tools=str(idlegrid_path), path=path, node=f"n{i}")],
            stdout=subprocess.PIPE,
        )
        for i in range(4)
    ]
    claimed = [job for p in procs for job in json.loads(p.communicate(timeout=120)[0])]
    assert sorted(claimed) == sorted(ids)  # every job once, none twice
    assert q.counts() == {"queued": 0, "leased": 0, "done": 150, "dead": 0}


def test_lease_expiry_requeues_and_counts_a_failure_then_dead_letters(tmp_path):
    clock = Clock()
    q = SqliteQueue(tmp_path / "q.db", max_failures=2, lease_ttl=10, clock=clock)
    job = q.submit(["true"])
    assert q.claim("a") is not None
    assert q.claim("b") is None  # leased, not expired
    clock.t += 11
    lease = q.claim("b")
    assert lease is not None and lease.job.failures == 1 and lease.job.attempts == 2
    clock.t += 11
    assert q.claim("c") is None  # second expiry reaches max_failures: dead, not requeued
    state, _, _, detail = q.result(job)
    assert state == "dead" and "lease expired" in detail


def test_heartbeat_keeps_the_lease_and_only_the_holder_completes(tmp_path):
    clock = Clock()
    q = SqliteQueue(tmp_path / "q.db", lease_ttl=10, clock=clock)
    job = q.submit(["true"])
    lease = q.claim("a")
    for _ in range(5):
        clock.t += 8
        assert q.heartbeat(lease, None)
    assert q.claim("b") is None
    clock.t += 11  # missed heartbeats: expired and claimed elsewhere
    other = q.claim("b")
    assert other is not None
    assert not q.heartbeat(lease, None)  # the old holder learns it lost the lease
    assert not q.complete(lease, Outcome("done", b"stale", 0))
    assert q.complete(other, Outcome("done", b"fresh", 0))
    assert q.result(job)[:2] == ("done", b"fresh")
    assert not q.complete(other, Outcome("done", b"again", 0))  # exactly once


def test_yields_never_dead_letter(tmp_path):
    q = SqliteQueue(tmp_path / "q.db", max_failures=1)
    job = q.submit(["true"])
    for n in range(1, 51):
        lease = q.claim("a")
        assert lease is not None and lease.job.yields == n - 1
        q.yield_(lease, json.dumps({"files": {"n": ""}}).encode())
    [row] = q.jobs()
    assert row["state"] == "queued" and row["yields"] == 50 and row["failures"] == 0
    lease = q.claim("a")
    assert q.fail(lease, "boom", None) == "dead"  # one real failure at max_failures=1
    assert q.result(job)[0] == "dead"
    q.requeue(job)
    assert q.claim("a") is not None


def test_own_leases_are_released_at_start_others_are_not(tmp_path):
    q = SqliteQueue(tmp_path / "q.db", lease_ttl=600)
    q.submit(["true"])
    q.submit(["true"])
    q.claim("a")
    q.claim("b")
    assert q.open("a") == 1
    rows = {r["id"]: r for r in q.jobs()}
    assert rows["1"]["state"] == "queued" and rows["1"]["failures"] == 1
    assert rows["2"]["state"] == "leased" and rows["2"]["lease_owner"] == "b"


def test_checkpoint_travels_with_the_requeued_job(tmp_path):
    q = SqliteQueue(tmp_path / "q.db")
    q.submit(["true"])
    src = tmp_path / "ck"
    src.mkdir()
    (src / "state.json").write_text('{"step": 42}')
    (src / "state.json.tmp").write_text("half-written")
    (src / ".hidden").write_text("x")
    lease = q.claim("a")
    assert lease.checkpoint is None
    q.yield_(lease, pack_checkpoint(src, 1 << 20))
    lease = q.claim("a")
    dest = tmp_path / "restored"
    assert unpack_checkpoint(lease.checkpoint, dest) == 1
    assert sorted(p.name for p in dest.iterdir()) == ["state.json"]
    assert (dest / "state.json").read_text() == '{"step": 42}'


def test_checkpoint_limits_and_hostile_names(tmp_path):
    src = tmp_path / "ck"
    src.mkdir()
    (src / "big").write_bytes(b"x" * 2048)
    with pytest.raises(UserError, match="larger than 1024 bytes"):
        pack_checkpoint(src, 1024)
    for name in ("../escape", "/etc/passwd", ".profile", "a/b"):
        blob = json.dumps({"files": {name: ""}}).encode()
        with pytest.raises(UserError, match="refusing checkpoint file"):
            unpack_checkpoint(blob, tmp_path / "out")
    assert not (tmp_path / "escape").exists()
    # malformed blobs from a hostile or corrupt queue: a UserError each, never a traceback
    for blob in (
        b"not json",
        b"[1]",
        json.dumps({"files": []}).encode(),
        json.dumps({"files": {"ok": 5}}).encode(),
        json.dumps({"files": {"x" * 300: ""}}).encode(),
        json.dumps({"files": {"ok": "***not base64***"}}).encode(),
    ):
        with pytest.raises(UserError):
            unpack_checkpoint(blob, tmp_path / "out2")
    assert pack_checkpoint(tmp_path / "missing", 10) is None


def test_unreachable_queue_is_reported_not_created(tmp_path):
    from erangrid.errors import CoordinatorUnreachable

    q = SqliteQueue(tmp_path / "no" / "such" / "q.db")
    with pytest.raises(CoordinatorUnreachable, match="does not exist"):
        q.claim("a")
    assert not (tmp_path / "no").exists()


def test_idle_claims_skip_the_write_but_never_miss_work(tmp_path):
    clock = Clock()
    agent_side = SqliteQueue(tmp_path / "q.db", lease_ttl=10, clock=clock)
    admin = SqliteQueue(tmp_path / "q.db", lease_ttl=10, clock=clock)
    assert agent_side.claim("a") is None  # empty: remembered
    assert agent_side._idle_version is not None
    job = admin.submit(["true"])  # another connection commits: data_version moves
    lease = agent_side.claim("a")
    assert lease is not None and lease.job.id == job
    assert admin.claim("b") is None  # leased for 10 s: b remembers when it runs out
    clock.t += 10.5  # no commit at all, only time: the expiry must still be noticed
    again = admin.claim("b")
    assert again is not None and again.job.id == job and again.job.failures == 1
