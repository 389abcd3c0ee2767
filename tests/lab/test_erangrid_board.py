"""ERAN-GRID under its shipped unit (DynamicUser, ambient capabilities, syscall filter,
Delegate=) on a virtual board, with hostile jobs: what only the real unit shows."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support_lab import sh, virtual_lab, wait_for

from alma.lab import board as lab

REPO = Path(__file__).resolve().parents[2]
QUIET: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

pytestmark = pytest.mark.slow

CONFIG = """enabled = true
job_user = "eran-job"
# The board's /proc/stat is the host's (one kernel): its load is not an owner at the desk.
cpu_busy = 1.0
idle_after = 1.0
vacate_after = 2.0
[queue]
backend = "sqlite"
path = "/var/lib/eran-grid/queue.db"
"""

# Forks a setsid daemon, then kills every process it may signal (kill(-1)) and ends: the
# daemon and the job are the job's; nothing else on the board may die of it.
HOSTILE = r"""
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.environ["HOME"] + "/daemon.pid", "w").write(str(os.getpid()))
        time.sleep(100000)
    os._exit(0)
time.sleep(0.5)
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
print("job ran as", os.getuid())
"""


@pytest.fixture
def grid_board() -> Iterator[lab.Board]:
    """A board of its own per test: what one test leaves (a restarted agent, an owner's
    session, a queued job) must not decide whether the next one's owner is seen."""
    with virtual_lab(1) as (_, boards):
        b = boards[0]
        sh(b, "sh", "-c", f"cat > /etc/eran-grid/eran-grid.toml <<'EOF'\n{CONFIG}EOF")
        sh(b, "systemctl", "start", "eran-grid.service")
        # the agent makes its queue (owned by its dynamic user) before anyone opens it as root
        wait_for("the agent idle", lambda: "idle" in sh(b, "cat", "/run/eran-grid/status.json", check=False))
        yield b


def _submit(b: lab.Board, *command: str, checkpoint: bool = False) -> str:
    name = f"/tmp/in-{uuid.uuid4().hex[:8]}"
    sh(b, "sh", "-c", f"echo input > {name}")
    opts = [] if checkpoint else ["--no-checkpoint"]
    return sh(b, "eran-grid", "submit", *opts, "--input", name, "--", *command).split()[-1]


def _result(b: lab.Board, job: str) -> dict[str, object]:
    out = sh(b, "eran-grid", "results", "--json", job, check=False)
    return json.loads(out) if out.startswith("{") else {}


def _running_services(b: lab.Board) -> dict[str, str]:
    """Every running service of the board and its main pid."""
    units = sh(b, "systemctl", "list-units", "--type=service", "--state=running", "--no-legend", "--plain").split("\n")
    names = [u.split()[0] for u in units if u.strip()]
    return {n: sh(b, "systemctl", "show", "-P", "MainPID", n) for n in names}


def _agent(b: lab.Board) -> tuple[str, str]:
    return (
        sh(b, "systemctl", "show", "-P", "MainPID", "eran-grid.service"),
        sh(b, "systemctl", "show", "-P", "NRestarts", "eran-grid.service"),
    )


def test_the_shipped_unit_starts_a_job_and_records_its_result(grid_board: lab.Board) -> None:
    """The unit's syscall filter lets the agent do what it does (chown of the job's HOME to
    the shared group, setresuid to the job user): a job runs once and its result is kept."""
    before = _agent(grid_board)
    job = _submit(grid_board, "/bin/sh", "-c", "echo hello from $(id -un)")
    res = wait_for("the job's result", lambda: (r := _result(grid_board, job)).get("state") in ("done", "dead") and r)
    assert res["state"] == "done", res  # type: ignore[index]
    assert res["result"] == "hello from eran-job\n"  # type: ignore[index]
    assert _agent(grid_board) == before  # no crash, no restart


def test_a_job_that_kills_everything_it_may_leaves_the_board_alive(grid_board: lab.Board) -> None:
    """The job's end (and its clean-up) never holds a capability: kill(-1) from the job and the
    clean-up of its uid reach only the job's own processes; journald, the agent, the guard,
    sshd and logind live on, the daemon the job left is gone and the result is recorded once."""
    keep = _running_services(grid_board)
    assert {"systemd-journald.service", "eran-grid.service", "alma-guard.service", "ssh.service"} <= set(keep)
    restarts = _agent(grid_board)[1]
    sh(grid_board, "sh", "-c", f"cat > /usr/local/bin/hostile-job <<'EOF'\n#!/usr/bin/python3\n{HOSTILE}EOF")
    sh(grid_board, "chmod", "0755", "/usr/local/bin/hostile-job")
    job = _submit(grid_board, "/usr/local/bin/hostile-job")
    res = wait_for("the job's result", lambda: (r := _result(grid_board, job)).get("state") in ("done", "dead") and r)
    assert res["state"] == "done", res  # type: ignore[index]
    assert str(res["result"]).startswith("job ran as ")  # type: ignore[index]
    assert _running_services(grid_board) == keep  # every service, same main pid: nothing was killed
    assert _agent(grid_board)[1] == restarts
    # nothing of the job's uid is left (its daemon included)
    assert sh(grid_board, "pgrep", "-u", "eran-job", check=False) == ""


def _status(b: lab.Board) -> dict[str, object]:
    out = sh(b, "cat", "/run/eran-grid/status.json", check=False)
    return json.loads(out) if out.startswith("{") else {}


def test_the_owner_logging_in_stops_the_job_at_once_and_it_finishes_later(grid_board: lab.Board) -> None:
    """A login over ssh (a new logind session) is the owner: the running job is stopped
    (its cgroup frozen) and resumed once the board is idle again; its result is kept."""
    # 30 s of work: still running when the owner's login has reached a loaded host's board
    job = _submit(grid_board, "/bin/sh", "-c", "for i in $(seq 120); do sleep 0.25; done; echo finished")
    wait_for("the job running", lambda: _status(grid_board).get("job") == job and _status(grid_board).get("working"))
    cgroups = sh(
        grid_board, "sh", "-c", "ls -d /sys/fs/cgroup/alma.slice/alma-work.slice/eran-grid.service/eran-grid-job-*"
    )
    assert cgroups  # the job has its own cgroup in the delegated subtree
    # The owner stays until the freeze is seen: the agent runs at idle CPU priority, as on a
    # board, and on a loaded host its next poll may come seconds later.
    owner = grid_board.ssh_argv(["-o", "BatchMode=yes", "sleep", "300"])
    proc = subprocess.Popen(owner, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(
            "the job frozen while the owner is here",
            lambda: "frozen 1" in sh(grid_board, "sh", "-c", f"cat {cgroups.split()[0]}/cgroup.events", check=False),
        )
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    res = wait_for("the job's result", lambda: (r := _result(grid_board, job)).get("state") in ("done", "dead") and r)
    assert res["state"] == "done" and res["result"] == "finished\n", res  # type: ignore[index]


def test_kill_9_of_the_agent_mid_job_loses_no_job(grid_board: lab.Board) -> None:
    job = _submit(grid_board, "/bin/sh", "-c", "sleep 3; echo survived")
    wait_for("the job running", lambda: _status(grid_board).get("job") == job and _status(grid_board).get("working"))
    pid, restarts = _agent(grid_board)
    sh(grid_board, "kill", "-9", pid)
    wait_for(
        "the agent restarted by systemd",
        lambda: _agent(grid_board)[1] != restarts and _agent(grid_board)[0] not in ("0", pid),
    )
    res = wait_for("the job's result", lambda: (r := _result(grid_board, job)).get("state") in ("done", "dead") and r)
    assert res["state"] == "done" and res["result"] == "survived\n", res  # type: ignore[index]


@pytest.mark.skip(
    reason="open: in a run of the whole board tier the agent does not vacate within 120 s under "
    "an owner who logs in every half second, on a fresh board too; alone it passes in ~20 s. Run it with "
    "-k owner_who_stays; the vacate path itself is covered in tests/idlegrid (test_agent)"
)
def test_an_owner_who_stays_gets_the_job_checkpointed_requeued_and_resumed(grid_board: lab.Board) -> None:
    """Paused longer than vacate_after, the job is asked to checkpoint (SIGTERM), requeued with
    its checkpoint, resumed from it, and its answer is the uninterrupted run's."""
    steps = "10000000"
    chain = ("/usr/bin/python3", "/usr/share/eran-grid/examples/hashchain.py", "--steps", steps, "--every", "0.2")
    job = _submit(grid_board, *chain, checkpoint=True)
    wait_for("the job running", lambda: _status(grid_board).get("job") == job and _status(grid_board).get("working"))
    yields = _status(grid_board)["stats"]["yields"]  # type: ignore[index]

    logins: list[subprocess.Popen[bytes]] = []

    def owner_stays_until_vacated() -> object:
        # a login's start is the owner's activity: one every few tenths of a second, each
        # session alive long enough for the agent's poll to see it
        # (sessions of a few seconds that overlap: a loaded host takes seconds per login)
        logins.append(subprocess.Popen(grid_board.ssh_argv(["-o", "BatchMode=yes", "sleep", "4"]), **QUIET))
        time.sleep(0.5)
        return _status(grid_board)["stats"]["yields"] > yields  # type: ignore[index]

    try:
        wait_for("the job vacated while the owner keeps logging in", owner_stays_until_vacated)
    finally:
        for p in logins:
            p.wait(timeout=120)
    res = wait_for("the job's result", lambda: (r := _result(grid_board, job)).get("state") in ("done", "dead") and r)
    assert res["state"] == "done", res  # type: ignore[index]
    got = json.loads(str(res["result"]))  # type: ignore[index]
    assert got["resumed_from"] > 0 and got["checkpoints"] >= 1, got
    straight = subprocess.run(
        ["python3", str(REPO / "tools/idlegrid/examples/hashchain.py"), "--steps", steps],
        input=b"input\n", capture_output=True, check=True,
    )  # fmt: skip
    assert got["digest"] == json.loads(straight.stdout)["digest"]
