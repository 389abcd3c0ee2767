"""The agent with real child processes (the hash-chain example workload) on a fake machine:
it works only while idle, stops the job's whole process group within one poll of the owner
returning, vacates long pauses with a checkpoint, and resumes requeued work from it."""

from __future__ import annotations

import json
import time

import pytest
from erangrid.process import proc_state


def _result(queue, job_id):
    state, result, code, detail = queue.result(job_id)
    assert state == "done", (state, detail)
    return json.loads(result)


def test_runs_when_idle_and_records_one_result(grid, digest):
    g = grid()
    job = g.hashchain(300_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: g.queue.counts()["done"] == 1)
    out = _result(g.queue, job)
    assert out["digest"] == digest(b"seed", 300_000) and out["resumed_from"] == 0
    [row] = g.queue.jobs()
    assert (row["attempts"], row["yields"], row["failures"]) == (1, 0, 0)
    assert agent.stats["done"] == 1


def test_owner_returning_stops_the_job_within_one_poll_then_it_resumes(grid, machine, digest):
    g = grid()
    job = g.hashchain(2_000_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None)
    pid = agent.proc.pid
    assert proc_state(pid) in "RSD"
    machine.touch_pts(3, time.time())  # the owner types into a new SSH session
    line = agent.step()  # exactly one poll
    assert line.startswith("paused job") and "owner active 0 s ago (pts/3)" in line
    assert proc_state(pid) == "T"  # the whole group is stopped
    time.sleep(0.3)
    assert proc_state(pid) == "T" and "owner active" in agent.step()
    machine.touch_pts(3, time.time() - 3600)  # the owner leaves; idle_after (1 s) already passed
    assert agent.step().startswith("running job")
    assert proc_state(pid) in "RSD"
    g.drive(agent, lambda: g.queue.counts()["done"] == 1)
    assert _result(g.queue, job)["digest"] == digest(b"seed", 2_000_000)
    assert agent.stats["pauses"] == 1


def test_vacate_checkpoints_requeues_as_a_yield_and_resumes_from_the_checkpoint(grid, machine, digest):
    g = grid(vacate_after=0.3)
    job = g.hashchain(3_000_000, every=0.05)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None)
    g.wait_checkpoint(agent)  # it computes and has checkpointed at least once
    machine.touch_pts(1, time.time())
    g.drive(agent, lambda: agent.proc is None, poll=0.05)  # paused → SIGTERM → exited → yielded
    [row] = g.queue.jobs()
    assert row["state"] == "queued" and row["yields"] == 1 and row["failures"] == 0
    assert row["checkpoint_bytes"] > 0
    assert any("yielded" in line for line in g.lines)
    # While the owner is still here, nothing is claimed again.
    assert "owner active" in agent.step() and g.queue.counts()["leased"] == 0
    machine.touch_pts(1, time.time() - 3600)
    g.drive(agent, lambda: g.queue.counts()["done"] == 1)
    out = _result(g.queue, job)
    assert out["resumed_from"] > 0  # the requeued job resumed, it did not start over
    assert out["digest"] == digest(b"seed", 3_000_000)
    [row] = g.queue.jobs()
    assert (row["attempts"], row["yields"], row["failures"]) == (2, 1, 0)


def test_heat_hard_pauses_and_resumes_only_after_the_holdoff(grid, machine):
    # Steps run back to back here, so the 91 -> 60 C drop would be an implausible jump (hot);
    # this test is about the hold-off, so the rate rule is opened wide.
    g = grid(heat_holdoff=0.6, thermal={"max_rate_c_per_s": 1e6})
    g.hashchain(3_000_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None)
    pid = agent.proc.pid
    machine.zone(1, "tj-thermal", 91.0)
    assert agent.step() == f"paused job {agent.lease.job.id}: hot: tj-thermal 91 °C"
    assert proc_state(pid) == "T"
    machine.zone(1, "tj-thermal", 60.0)
    assert "cooling: resume in" in agent.step() and proc_state(pid) == "T"
    time.sleep(0.7)
    assert agent.step().startswith("running job") and proc_state(pid) != "T"
    agent.shutdown()


def test_guard_shedding_pauses_like_heat(grid, machine):
    g = grid()
    g.hashchain(3_000_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None)
    machine.guard_state(shedding=True, reason="tj-thermal 88.0 C >= shed 85.0 C")
    assert "hot: guard shedding: tj-thermal 88.0 C" in agent.step()
    assert proc_state(agent.proc.pid) == "T"
    agent.shutdown()
    assert g.queue.jobs()[0]["yields"] == 1  # stopping the agent yields, never loses


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (
            lambda m: (m.supply("ADP1", "Mains", online=False), m.supply("BAT0", "Battery", status="Discharging")),
            "on battery",
        ),
        (lambda m: m.zone(0, "cpu-thermal", 85.4), "hot: cpu-thermal 85 °C"),
        (lambda m: m.guard_state(shedding=False, updated=time.time() - 7200), "hot: thermal guard state stale"),
        (lambda m: m.guard.unlink(), "hot: thermal guard state missing"),
        # active "now" for as long as the steps take on a loaded host (idle_after is 1 s)
        (lambda m: m.touch_pts(2, time.time() + 3600), "owner active 0 s ago (pts/2)"),
    ],
)
def test_no_claim_while_a_condition_says_no(grid, machine, setup, expected):
    g = grid()
    g.hashchain(1000)
    agent = g.agent()
    agent.start()
    setup(machine)
    for _ in range(3):
        assert agent.step().startswith(expected)
    assert g.queue.counts() == {"queued": 1, "leased": 0, "done": 0, "dead": 0}


def test_unreachable_coordinator_waits_and_says_so_then_recovers(grid, tmp_path):
    g = grid()
    g.hashchain(1000)
    import dataclasses

    from erangrid.agent import Agent
    from erangrid.sqlite_queue import SqliteQueue

    missing = tmp_path / "nfs" / "queue.db"
    cfg = dataclasses.replace(g.cfg, queue=dataclasses.replace(g.cfg.queue, path=missing))
    agent = Agent(cfg, SqliteQueue(missing), log=g.lines.append)
    agent.start()
    line = agent.step()
    assert line.startswith("coordinator unreachable since ") and "does not exist" in line
    assert agent.proc is None  # fail closed: no local simulation of work
    missing.parent.mkdir()
    (missing.parent / "queue.db").symlink_to(g.cfg.queue.path)
    g.drive(agent, lambda: g.queue.counts()["done"] == 1)


def test_a_failing_job_is_retried_then_dead_lettered_with_its_error(grid):
    g = grid(max_failures=2)
    job = g.queue.submit(["python3", "-c", "import sys; sys.exit('bad input')"])
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: g.queue.counts()["dead"] == 1)
    state, result, code, detail = g.queue.result(job)
    assert state == "dead" and "exit code 1: bad input" in detail
    assert g.queue.jobs()[0]["failures"] == 2


def test_a_missing_command_fails_the_attempt_cleanly(grid):
    g = grid(max_failures=1)
    job = g.queue.submit(["/nonexistent/program"])
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: g.queue.counts()["dead"] == 1)
    assert "cannot start /nonexistent/program" in g.queue.result(job)[3]


def test_poll_interval_is_fast_only_while_a_job_exists(grid):
    g = grid(poll=0.2, slow_poll=1.0, idle_poll=2.0)
    g.hashchain(3_000_000)
    agent = g.agent()
    agent.start()
    assert agent.interval() == 2.0  # nothing to stop: wake every idle_poll
    g.drive(agent, lambda: agent.proc is not None)
    assert agent.interval() == 0.2  # a job exists: the owner's return is acted on within 0.2 s
    agent.shutdown()


def test_a_hostile_checkpoint_fails_the_job_not_the_agent(grid, tmp_path):
    import sqlite3

    g = grid(max_failures=1)
    job = g.queue.submit(["true"])
    blob = json.dumps({"files": {"../../escape": "eA=="}}).encode()
    with sqlite3.connect(g.cfg.queue.path) as db:
        db.execute("UPDATE jobs SET checkpoint=? WHERE id=?", (blob, job))
    agent = g.agent()
    agent.start()
    line = agent.step()
    assert line == f"job {job} could not start (recorded as a failure)"
    state, _, _, detail = g.queue.result(job)
    assert state == "dead" and "unusable checkpoint" in detail and "refusing checkpoint file" in detail
    assert not (g.cfg.state_dir / "escape").exists() and not (tmp_path / "escape").exists()
    assert agent.step().startswith("idle")  # the agent goes on


def test_an_oversized_checkpoint_is_skipped_not_fatal(grid):
    g = grid(checkpoint_max_bytes=64, lease_ttl=0.3)
    job = g.queue.submit(
        [
            "python3",
            "-c",
            "import os, time; d = os.environ['ERAN_GRID_CHECKPOINT_DIR'];"
            " open(os.path.join(d, 'big'), 'w').write('x' * 1000); time.sleep(0.6)",
        ]
    )
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: g.queue.result(job)[0] == "done")
    assert any("checkpoint not saved" in line and "larger than 64 bytes" in line for line in g.lines)
