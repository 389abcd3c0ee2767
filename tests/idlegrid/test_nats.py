"""The same agent on NATS JetStream: a real nats-server (Debian's) on loopback with JetStream
in a temp dir. Work-queue stream, explicit acks, nak on yield, in-progress acks, redelivery
after a crash, results exactly once on their own stream, and a server restart mid-job."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
import uuid

import pytest
from erangrid.agent import Agent
from erangrid.errors import CoordinatorUnreachable
from erangrid.jobs import Outcome
from erangrid.nats_queue import NatsQueue, _key
from nats.js.errors import NotFoundError
from support import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _close_every_queue(monkeypatch):
    """Every client thread ends with its test, pass or fail (a stray reconnect loop would
    outlive the test and race the next one)."""
    made: list[NatsQueue] = []
    real_init = NatsQueue.__init__

    def tracking_init(self, *a, **kw):
        real_init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(NatsQueue, "__init__", tracking_init)
    yield
    for q in made:
        q.close()


def _nats_grid(grid, server, **over):
    g = grid(**over)
    g.data["queue"] = {"backend": "nats", "url": server.url, "stream": "TEST"}
    from erangrid.config import from_mapping

    g.cfg = from_mapping(g.data)
    return g


def _queue(server, **kw) -> NatsQueue:
    kw.setdefault("lease_ttl", 30.0)
    return NatsQueue(server.url, "TEST", **kw)


def _agent(g, node="node-a", **kw):
    cfg = dataclasses.replace(g.cfg, node=node)
    return Agent(cfg, _queue_for(g, cfg), log=g.lines.append, **kw)


def _queue_for(g, cfg):
    return NatsQueue(
        cfg.queue.url, cfg.queue.stream, max_failures=cfg.max_failures, lease_ttl=cfg.lease_ttl, backoff=0.0
    )


def _chain(hashchain_path, steps, seed, every=0.05):
    return [sys.executable, str(hashchain_path), "--steps", str(steps), "--seed", seed, "--every", str(every)]


def _done(q, job):
    return q.result(job)[0] == "done"


def test_runs_a_job_and_stores_one_result(grid, nats_server, hashchain_path, digest):
    g = _nats_grid(grid, nats_server)
    admin = _queue(nats_server)
    job = admin.submit(_chain(hashchain_path, 200_000, "one"))
    assert admin.counts()["queued"] == 1
    agent = _agent(g)
    agent.start()
    g.drive(agent, lambda: _done(admin, job))
    state, result, code, _ = admin.result(job)
    assert json.loads(result)["digest"] == digest(b"one", 200_000) and code == 0
    assert admin.counts() == {"queued": 0, "leased": 0, "done": 1, "dead": 0}
    [row] = admin.jobs(("done",))
    assert row["id"] == job and row["yields"] == 0
    agent.shutdown()
    admin.close()


def test_yield_naks_with_checkpoint_and_the_job_resumes(grid, machine, nats_server, hashchain_path, digest):
    g = _nats_grid(grid, nats_server, vacate_after=0.3)
    admin = _queue(nats_server)
    job = admin.submit(_chain(hashchain_path, 3_000_000, "yield"))
    agent = _agent(g)
    agent.start()
    g.drive(agent, lambda: agent.proc is not None)
    g.wait_checkpoint(agent)
    machine.touch_pts(1, time.time())
    g.drive(agent, lambda: agent.proc is None, timeout=60, poll=0.05)
    assert agent.stats["yields"] == 1
    counts = admin.counts()  # nak: back in the work queue (JetStream counts it unacked until redelivered)
    assert counts["queued"] + counts["leased"] == 1 and counts["done"] == 0
    machine.touch_pts(1, time.time() - 3600)
    g.drive(agent, lambda: _done(admin, job), timeout=600)  # the work itself runs at the machine's pace
    out = json.loads(admin.result(job)[1])
    assert out["resumed_from"] > 0 and out["digest"] == digest(b"yield", 3_000_000)
    [row] = admin.jobs(("done",))
    assert row["yields"] == 1 and row["failures"] == 0
    agent.shutdown()
    admin.close()


def test_result_is_accepted_exactly_once(nats_server):
    q = _queue(nats_server, lease_ttl=1.0)
    q.open("a")
    job = q.submit(["true"])
    first = q.claim("a")
    assert first is not None
    time.sleep(1.3)  # AckWait runs out: JetStream redelivers the same job
    second = None
    for _ in range(20):
        second = q.claim("b")
        if second is not None:
            break
    assert second is not None and second.job.id == job and second.job.attempts == 2
    assert q.complete(second, Outcome("done", b"from b", 0)) is True
    assert q.complete(first, Outcome("done", b"from a", 0)) is False  # the server refuses a second result
    assert q.result(job)[:2] == ("done", b"from b")
    q.close()


def test_job_ids_that_differ_only_by_a_dot_never_share_a_result_or_a_checkpoint(nats_server):
    """Ids are keys of subjects and KV entries; "a.b" and "a_b" used to map to one key, so a
    queue writer's "a.b" finishing first forged honest "a_b"'s result (and shared its checkpoint)."""
    q = _queue(nats_server)
    q.open("a")

    async def publish(job_id: str) -> None:
        await q._connect()
        await q._js.publish(q.subject, json.dumps({"id": job_id, "command": ["true"]}).encode())

    for job_id in ("a_b", "a.b"):
        q._run(publish(job_id))
    leases = {}
    for _ in range(20):
        lease = q.claim("a")
        if lease is not None:
            leases[lease.job.id] = lease
        if len(leases) == 2:
            break
    assert set(leases) == {"a_b", "a.b"}
    q.heartbeat(leases["a.b"], b'{"files": {"planted": "eA=="}}')
    assert q.complete(leases["a.b"], Outcome("done", b"FORGED", 0)) is True
    assert q.complete(leases["a_b"], Outcome("done", b"honest", 0)) is True
    assert q.result("a_b")[:2] == ("done", b"honest") and q.result("a.b")[:2] == ("done", b"FORGED")
    q.close()


def test_failures_dead_letter_but_yields_do_not(nats_server):
    q = _queue(nats_server, max_failures=2, backoff=0.0)
    q.open("a")
    job = q.submit(["false"])
    for _ in range(5):
        lease = None
        while lease is None:
            lease = q.claim("a")
        q.yield_(lease, None)
    lease = None
    while lease is None:
        lease = q.claim("a")
    assert lease.job.yields == 5 and lease.job.failures == 0
    assert q.fail(lease, "exit code 1", None) == "queued"
    lease = None
    deadline = time.monotonic() + 60  # the redelivery comes at the server's pace
    while lease is None and time.monotonic() < deadline:
        lease = q.claim("a")
    assert q.fail(lease, "exit code 1 again", None) == "dead"
    state, _, _, detail = q.result(job)
    assert state == "dead" and "exit code 1 again" in detail
    assert q.counts()["queued"] == 0
    q.close()


def test_kill_9_then_same_node_restart_releases_its_lease_at_once(
    grid, nats_server, eran_grid_cmd, hashchain_path, digest
):
    g = _nats_grid(grid, nats_server, lease_ttl=120.0)  # AckWait far away: only the release frees it
    admin = _queue(nats_server, lease_ttl=120.0)
    seed = f"k9-{uuid.uuid4().hex}"
    job = admin.submit(_chain(hashchain_path, 6_000_000, seed))
    cfg_file = g.config_file(lease_ttl=1.2)  # heartbeats (and checkpoint sync) every 0.4 s ...
    proc = subprocess.Popen(
        [*eran_grid_cmd, "--config", str(cfg_file), "run"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    async def checkpoint() -> bytes | None:
        await admin._connect()
        with contextlib.suppress(NotFoundError):
            return (await admin._kv.get(f"ckpt.{_key(job)}")).value
        return None

    try:
        # ... killed once a checkpoint is in the KV bucket (waited for: the sync's pace is the machine's)
        wait_for(lambda: admin._run(checkpoint()), what="the job's first checkpoint in the KV bucket")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    agent = _agent(g)  # node-a again, with the 120 s AckWait of this consumer's config
    assert agent.start() == 1
    # released at once: the job runs again well before the 120 s AckWait would redeliver it
    # (timed to its start: how long the work then takes is the machine's load, not the lease)
    g.drive(agent, lambda: agent.proc is not None, timeout=90)
    g.drive(agent, lambda: _done(admin, job), timeout=600)
    out = json.loads(admin.result(job)[1])
    assert out["digest"] == digest(seed.encode(), 6_000_000) and out["resumed_from"] > 0
    [row] = admin.jobs(("done",))
    assert row["failures"] == 1  # the killed attempt counts as a failure, not a yield
    agent.shutdown()
    admin.close()


def test_server_restart_mid_job_loses_nothing(grid, nats_server, hashchain_path, digest):
    g = _nats_grid(grid, nats_server, lease_ttl=6.0)
    admin = _queue(nats_server, lease_ttl=6.0)
    job = admin.submit(_chain(hashchain_path, 16_000_000, "restart"))  # outlasts the outage
    admin.close()
    agent = _agent(g)
    agent.start()
    g.drive(agent, lambda: agent.proc is not None)
    nats_server.stop()
    line = g.drive(agent, lambda: agent.coord_down_since is not None, timeout=60)
    # A heartbeat failed: it says so, and the job goes on inside its lease (the work is local).
    assert agent.proc is not None and line.startswith("running job"), g.lines
    assert "(coordinator unreachable since 20" in line and "the lease holds until" in line
    assert agent.status()["line"] == line
    nats_server.start()
    g.drive(agent, lambda: agent.proc is None and agent.pending is None, timeout=120)
    admin = _queue(nats_server)
    state, result, _, _ = admin.result(job)
    assert state == "done" and json.loads(result)["digest"] == digest(b"restart", 16_000_000)
    assert admin.counts() == {"queued": 0, "leased": 0, "done": 1, "dead": 0}
    agent.shutdown()
    admin.close()


def test_unreachable_server_fails_closed_with_a_status_line(grid, nats_server):
    g = _nats_grid(grid, nats_server)
    nats_server.stop()
    agent = _agent(g)
    agent.start()
    line = agent.step()
    assert line.startswith("coordinator unreachable since ") and agent.proc is None
    with pytest.raises(CoordinatorUnreachable):
        _queue(nats_server, connect_timeout=0.5).ping()
    nats_server.start()
    agent.backend.close()
