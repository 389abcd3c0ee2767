"""ERANCLOUD's worker as a real ERAN-GRID job: the agent runs it while the machine is idle,
SIGSTOPs it when the owner returns, vacates it (SIGTERM → checkpoint → exit 75 → requeued with
the checkpoint) and runs it again when the owner leaves; the worker resumes its round from the
checkpoint and the job finishes with its result. A real coordinator on a real nats-server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ERANCLOUD = Path(__file__).resolve().parents[2] / "tools" / "erancloud"


def _watch(agent, cond, timeout: float = 120.0) -> None:
    """Until ``cond()``: polled every millisecond (the test reacts to the job at once, not a
    poll period later), the agent stepped every 50 ms meanwhile (its lease, its signals)."""
    deadline = next_step = time.monotonic()
    deadline += timeout
    while not cond():
        now = time.monotonic()
        assert now < deadline, f"timed out after {timeout:.0f} s"
        if now >= next_step:
            agent.step()
            next_step = now + 0.05
        time.sleep(0.001)


def test_erancloud_worker_yields_and_resumes_as_a_grid_job(grid, machine, nats_server, monkeypatch, tmp_path):
    sys.path.insert(0, str(ERANCLOUD))
    from erancloud import protocol
    from erangrid import presence
    from support_erancloud import Peek, wait_for

    monkeypatch.setenv("PYTHONPATH", str(ERANCLOUD))  # the agent passes PYTHONPATH on to its jobs
    status = tmp_path / "status.json"
    coord = subprocess.Popen(
        [sys.executable, "-m", "erancloud", "coordinator", "--nats", nats_server.url, "--rounds", "50",
         "--min-deltas", "1", "--round-timeout", "60", "--h-steps", "8000", "--status-file", str(status)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ERANCLOUD)},
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "coord.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    peek = None
    try:
        wait_for(status.exists, 60, "the coordinator")
        peek = Peek(nats_server.url)
        g = grid(vacate_after=0.3, grace=10.0)
        job = g.queue.submit([sys.executable, "-m", "erancloud", "client", "--nats", nats_server.url, "--rounds", "2"],
                             name="erancloud")  # fmt: skip
        worker = f"job-{job}"
        agent = g.agent()
        agent.start()
        g.drive(agent, lambda: agent.proc is not None and peek.get(f"worker.{worker}") is not None, timeout=120)
        # The owner returns mid-round 0, however fast or loaded the host (a fixed sleep let a
        # fast idle host push round 0 first): the job is stopped the moment the worker says it
        # trains round 0 and its group has had 2 more ticks of CPU (about 1 % of its 8000 local
        # steps here), then the owner comes back and the agent stops and vacates it as usual.
        job_proc, cpu = agent.proc, presence.CpuLoad()
        _watch(agent, lambda: "round 0: training" in job_proc.stderr_path.read_text(errors="replace"))
        ticks = cpu.group_ticks(job_proc.pgid)
        _watch(agent, lambda: cpu.group_ticks(job_proc.pgid) >= ticks + 2)
        os.killpg(job_proc.pgid, signal.SIGSTOP)  # the agent's terminate() sends SIGCONT
        assert peek.get(protocol.push_key(0, worker)) is None
        machine.touch_pts(1, time.time())  # the owner is back
        g.drive(agent, lambda: agent.proc is None, timeout=60)
        assert agent.stats["yields"] == 1 and agent.stats["failed"] == 0, g.lines
        assert any("yielded" in ln and "checkpoint" in ln for ln in g.lines), g.lines
        machine.touch_pts(1, time.time() - 3600)  # and gone again
        g.drive(agent, lambda: g.queue.result(job)[0] == "done", timeout=180)
        state, result, code, _ = g.queue.result(job)
        out = json.loads(result)
        assert code == 0 and out["worker"] == worker and out["rounds"] == 2, out
        assert out["pushed"][0]["round"] == 0
        [resumed] = out["resumed"]  # round 0 finished from the checkpoint, not started over
        assert resumed["round"] == 0 and resumed["step"] > 0
        assert peek.get(protocol.verdict_key(0, worker))["accepted"]
        agent.shutdown()
    finally:
        if peek is not None:
            peek.close()
        coord.kill()
        coord.wait()
