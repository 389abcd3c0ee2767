"""A job that floods its HOME with empty files: the owner check comes first on every poll,
the walk of HOME does bounded work per poll, and HOME is capped in inodes as well as bytes.
(200,000 empty files once made a ~2 s walk that ran before the owner check every few slow
polls, and counted 4.5 MB of blocks against a 256 MiB cap: the owner waited ~1 s and the
flood was never capped.) Behaviour, never timing: what each poll did, in what order."""

from __future__ import annotations

import sys
import time

import pytest
from erangrid import agent as agent_mod

FLOOD = """
import os, sys, time
n = int(sys.argv[1])
home = os.environ["HOME"]
for i in range(n):
    open(os.path.join(home, f"f{i}"), "w").close()
open(os.path.join(home, "flooded"), "w").close()
time.sleep(600)
"""


def _flood_job(g, n: int) -> str:
    return g.queue.submit([sys.executable, "-c", FLOOD, str(n)], name="flood")


def _home(g, agent):
    from erangrid.jobs import job_dir

    return job_dir(g.cfg.state_dir, agent.lease.job.id) / "home"


def test_the_walk_of_home_is_bounded_per_poll_and_an_inode_flood_is_capped(grid):
    g = grid(job_disk_max_inodes=5_000)
    job = _flood_job(g, 12_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None, timeout=120)
    works = []
    deadline = time.monotonic() + 120
    line = ""
    meter = None
    while agent.proc is not None and time.monotonic() < deadline:
        meter = agent.home_meter or meter
        line = agent.step()
        if meter is not None:
            works.append(meter.work)
        time.sleep(0.01)  # the job floods meanwhile
    assert meter is not None
    assert "killed: files in HOME over job_disk_max_inodes (5000)" in line
    assert max(works) <= meter.budget  # never more than one slice of the walk in a poll
    assert len(works) >= 5_000 // meter.budget  # so the cap took several polls to reach
    [row] = g.queue.jobs()
    assert row["id"] == job and row["failures"] == 1 and "job_disk_max_inodes" in row["detail"]


def test_the_owner_is_served_before_the_walk_on_the_poll_he_returns(grid, machine, monkeypatch):
    g = grid()
    _flood_job(g, 20_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None and (_home(g, agent) / "flooded").exists(), timeout=120)
    seen: list[tuple[bool, int]] = []
    real_step = agent_mod.HomeMeter.step

    def spying_step(self):
        seen.append((bool(agent.proc is not None and agent.proc.stopped), len(seen)))
        return real_step(self)

    monkeypatch.setattr(agent_mod.HomeMeter, "step", spying_step)
    assert agent.step().startswith("running job")
    assert seen and seen[-1][0] is False
    machine.touch_pts(0, time.time())  # the owner is back
    before = len(seen)
    line = agent.step()
    assert line.startswith("paused job")
    assert len(seen) == before + 1 and seen[-1][0] is True  # stopped first, then the slice of walk
    assert agent.home_meter is not None and agent.home_meter.work <= agent.home_meter.budget


@pytest.mark.parametrize("n", [0, 3, 2_500])
def test_the_meter_counts_every_inode_and_byte_across_slices(tmp_path, n):
    top = tmp_path / "home"
    (top / "d" / "e").mkdir(parents=True)
    for i in range(n):
        (top / "d" / f"f{i}").touch()
    (top / "d" / "e" / "data").write_bytes(b"x" * 100_000)
    m = agent_mod.HomeMeter(top, budget=100)
    steps = 0
    while m.passes == 0:
        used, inodes = m.step()
        steps += 1
        assert m.work <= 100
    assert inodes == n + 3  # d, d/e, d/e/data and the files
    assert used >= 100_000
    assert steps >= (n + 3) // 100
