"""Crashes lose nothing: kill -9 of the agent mid-job (the job dies with it, the lease runs out,
another node resumes from the last synced checkpoint), and a crash between claim and start
(the restarted node releases its own lease at once)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support import wait_for


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow
def test_kill_9_of_the_agent_mid_job_requeues_on_lease_expiry_and_resumes(grid, eran_grid_cmd, hashchain_path, digest):
    g = grid(lease_ttl=1.5)
    seed = f"kill9-{uuid.uuid4().hex}"
    steps = 8_000_000
    job = g.queue.submit(
        [sys.executable, str(hashchain_path), "--steps", str(steps), "--seed", seed, "--every", "0.05"]
    )
    agent = subprocess.Popen(
        [*eran_grid_cmd, "--config", str(g.config_file()), "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        # Wait until the job runs and a heartbeat has carried a checkpoint into the queue.
        wait_for(lambda: (g.queue.jobs()[0]["checkpoint_bytes"] or 0) > 0, what="a synced checkpoint")
        [job_pid] = [p for p in _pids_with(seed) if "wrapper.py" not in _cmdline(p)]
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    # The job dies with its agent (the wrapper's PR_SET_PDEATHSIG kills the job's group): no
    # orphan keeps computing a job that is about to be handed to another node.
    wait_for(lambda: not Path(f"/proc/{job_pid}").exists() or _state(job_pid) == "Z", what="the orphan to die")
    [row] = g.queue.jobs()
    assert row["state"] == "leased" and row["lease_owner"] == "node-a"

    other = g.agent(node="node-b")
    other.start()
    assert other.step().startswith(("idle", "running"))  # before expiry nothing is claimable
    g.drive(other, lambda: g.queue.counts()["done"] == 1, timeout=60)
    state, result, _, _ = g.queue.result(job)
    out = json.loads(result)
    assert out["resumed_from"] > 0 and out["digest"] == digest(seed.encode(), steps)
    [row] = g.queue.jobs()
    assert (row["attempts"], row["failures"], row["yields"]) == (2, 1, 0)
    assert "lease expired" not in row["detail"]  # the result replaced the crash note


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


CRASH_AFTER_CLAIM = """
import os, sys
sys.path.insert(0, {tools!r})
from erangrid.config import load
from erangrid.agent import Agent
from erangrid.sqlite_queue import SqliteQueue
cfg = load({config!r})
def crash(*_a, **_k):
    os._exit(137)  # the board lost power between claim and start
agent = Agent(cfg, SqliteQueue(cfg.queue.path, lease_ttl=cfg.lease_ttl), spawn=crash)
agent.start()
agent.step()
"""


def test_crash_between_claim_and_start_is_released_by_the_same_node_at_restart(grid, idlegrid_path, digest):
    g = grid(lease_ttl=600)  # long lease: only the restart's own-lease release can free it
    job = g.hashchain(100_000)
    code = CRASH_AFTER_CLAIM.format(tools=str(idlegrid_path), config=str(g.config_file()))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 137, proc.stderr
    [row] = g.queue.jobs()
    assert row["state"] == "leased" and row["attempts"] == 1

    agent = g.agent()  # the same node comes back
    assert agent.start() == 1
    assert any("released 1 lease" in line for line in g.lines)
    [row] = g.queue.jobs()
    assert row["state"] == "queued" and row["failures"] == 1
    g.drive(agent, lambda: g.queue.counts()["done"] == 1)
    assert json.loads(g.queue.result(job)[1])["digest"] == digest(b"seed", 100_000)


def test_crash_between_claim_and_start_is_requeued_for_other_nodes_on_lease_expiry(grid, idlegrid_path):
    g = grid(lease_ttl=0.5)
    g.hashchain(1000)
    code = CRASH_AFTER_CLAIM.format(tools=str(idlegrid_path), config=str(g.config_file()))
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 137
    other = g.agent(node="node-b")
    other.start()
    g.drive(other, lambda: g.queue.counts()["done"] == 1)
    [row] = g.queue.jobs()
    assert (row["attempts"], row["failures"]) == (2, 1)
