"""ERAN-GRID never leaves an orphan and never re-runs a finished job.

Real agents (`eran-grid run`, killed with real signals), real jobs with grandchildren, the
real SQLite queue; "no process of the old job remains" is checked in /proc. Malformed queue
rows are written straight into the database, as a foreign writer or a hand edit would.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import DEADLINE_S, wait_for

# A job with a grandchild: the grandchild appends to a file for as long as it lives; the
# job records each run in a ledger, waits until SECONDS pass (or a release file appears),
# then prints its result. Pids go to files so the test can look for them in /proc.
FAMILY = textwrap.dedent(
    """
    import os, subprocess, sys, time
    shared, seconds = sys.argv[1], float(sys.argv[2])
    with open(os.path.join(shared, "ledger"), "a") as fh:
        fh.write(f"run {os.getpid()}\\n")
    writer = subprocess.Popen([sys.executable, "-c",
        "import sys, time\\nwhile True:\\n    open(sys.argv[1], 'a').write('x')\\n    time.sleep(0.02)",
        os.path.join(shared, "written")])
    with open(os.path.join(shared, "pids"), "a") as fh:
        fh.write(f"{os.getpid()} {writer.pid}\\n")
    end = time.monotonic() + seconds
    while time.monotonic() < end and not os.path.exists(os.path.join(shared, "release")):
        time.sleep(0.02)
    print(f"result of {os.getpid()}")
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _pids(shared: Path) -> list[tuple[int, int]]:
    if not (shared / "pids").exists():
        return []
    return [tuple(map(int, line.split())) for line in (shared / "pids").read_text().splitlines()]  # type: ignore[misc]


@pytest.fixture
def family(tmp_path: Path) -> Path:
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    shared = tmp_path / "shared"
    shared.mkdir()
    return shared


def _start_agent(eran_grid_cmd: list[str], config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*eran_grid_cmd, "--config", str(config), "run"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)


# -- containment -------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_of_the_agent_leaves_no_process_of_the_job_and_a_restart_runs_it_alone(
    grid, eran_grid_cmd, family: Path, tmp_path: Path
) -> None:
    g = grid(lease_ttl=600)  # only the same node's restart can take the job again
    g.queue.submit([sys.executable, str(tmp_path / "family.py"), str(family), "60"])
    agent = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: len(_pids(family)) == 1 and (family / "written").exists(), what="the job and its grandchild")
        [(job_pid, writer_pid)] = _pids(family)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    finally:
        _stop(agent)
    # The old code: only the direct child got the death signal; the writer kept writing.
    wait_for(lambda: not _alive(job_pid) and not _alive(writer_pid), what="the job and its grandchild to die")
    size = (family / "written").stat().st_size
    time.sleep(0.2)
    assert (family / "written").stat().st_size == size

    again = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: len(_pids(family)) == 2, what="the second run")
        (family / "release").write_text("")
        wait_for(lambda: g.queue.counts()["done"] == 1, what="the result")
    finally:
        _stop(again)
    assert (family / "ledger").read_text().count("run ") == 2  # run again, but never beside the old one


@pytest.mark.slow
def test_a_restarted_agent_stops_what_the_old_job_left_before_running_it_again(
    grid, eran_grid_cmd, family: Path, tmp_path: Path
) -> None:
    """Agent and wrapper killed at once (nothing could clean up): the restart must."""
    g = grid(lease_ttl=600)
    g.queue.submit([sys.executable, str(tmp_path / "family.py"), str(family), "60"])
    agent = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: len(_pids(family)) == 1 and (family / "written").exists(), what="the job and its grandchild")
        [(job_pid, writer_pid)] = _pids(family)
        [workdir] = (g.cfg.state_dir / "work").iterdir()
        wrapper = json.loads((workdir / "wrapper.json").read_text())["pid"]
        os.kill(wrapper, signal.SIGKILL)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    finally:
        _stop(agent)
    time.sleep(0.3)
    assert _alive(job_pid) and _alive(writer_pid)  # orphans: nobody was left to stop them

    again = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: len(_pids(family)) == 2, what="the second run")
        # By the time the job runs again, nothing of the old one is alive.
        assert not _alive(job_pid) and not _alive(writer_pid)
        (family / "release").write_text("")
        wait_for(lambda: g.queue.counts()["done"] == 1, what="the result")
    finally:
        _stop(again)


# -- effectively once ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_that_finishes_while_its_agent_is_stopped_then_killed_is_recorded_once(
    grid, eran_grid_cmd, family: Path, tmp_path: Path
) -> None:
    g = grid(lease_ttl=600)
    job = g.queue.submit([sys.executable, str(tmp_path / "family.py"), str(family), "60"])
    agent = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: len(_pids(family)) == 1, what="the job")
        [(job_pid, _writer)] = _pids(family)
        os.kill(agent.pid, signal.SIGSTOP)  # the agent cannot record anything now
        (family / "release").write_text("")
        wait_for(lambda: not _alive(job_pid), what="the job to finish")
        [workdir] = (g.cfg.state_dir / "work").iterdir()
        wait_for(lambda: (workdir / "exit.json").exists(), what="the wrapper's exit record")
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    finally:
        _stop(agent)
    (family / "release").unlink()
    [row] = g.queue.jobs()
    assert row["state"] == "leased"  # the old agent never recorded it

    again = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: g.queue.counts()["done"] == 1, what="the recovered result")
        time.sleep(0.5)
    finally:
        _stop(again)
    state, result, exit_code, _detail = g.queue.result(job)
    assert (state, exit_code) == ("done", 0) and result == f"result of {job_pid}\n".encode()
    assert (family / "ledger").read_text().count("run ") == 1  # one run, one result
    [row] = g.queue.jobs()
    assert (row["attempts"], row["failures"]) == (1, 0)


# -- malformed rows ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["[]", "not json", "[1,2]", '["ok", ""]', '{"argv": 1}', 7])
def test_a_malformed_row_is_dead_lettered_at_once_and_the_next_job_runs(grid, command, digest) -> None:
    g = grid()
    g.queue.counts()  # creates the schema
    db = sqlite3.connect(g.cfg.queue.path)
    db.execute("INSERT INTO jobs (command, submitted) VALUES (?, ?)", (command, time.time()))
    db.commit()
    db.close()
    good = g.hashchain(1000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: g.queue.counts()["done"] == 1)  # the old agent crashed on the first row
    rows = {r["id"]: r for r in g.queue.jobs()}
    bad = next(r for r in rows.values() if r["id"] != good)
    assert bad["state"] == "dead" and bad["detail"].startswith("malformed row: ")
    assert bad["attempts"] == 1 and bad["failures"] == 0  # dead at the first look, not after three crashes
    agent.shutdown()


def test_queue_list_shows_malformed_rows_instead_of_crashing(grid, eran_grid_cmd) -> None:
    g = grid()
    g.queue.counts()  # creates the schema
    db = sqlite3.connect(g.cfg.queue.path)
    for command in ("[]", "not json", "[1,2]"):
        db.execute("INSERT INTO jobs (command, submitted) VALUES (?, ?)", (command, time.time()))
    db.commit()
    db.close()
    agent = g.agent()
    agent.start()
    for _ in range(3):
        agent.step()
    agent.shutdown()
    r = subprocess.run(
        [*eran_grid_cmd, "--config", str(g.config_file()), "queue", "list"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("dead") == 3 and r.stdout.count("malformed row") == 3 and "Traceback" not in r.stderr
    js = subprocess.run(
        [*eran_grid_cmd, "--config", str(g.config_file()), "queue", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert [row["state"] for row in json.loads(js.stdout)] == ["dead", "dead", "dead"]


# -- the yield line names its reason -------------------------------------------------------


STUBBORN = (
    "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "pathlib.Path(sys.argv[1]).touch(); time.sleep(3600)"
)


@pytest.mark.parametrize("stubborn", [False, True], ids=["checkpointed", "killed-after-grace"])
def test_a_vacated_job_yields_with_its_reason_in_the_line(grid, machine, tmp_path: Path, stubborn: bool) -> None:
    g = grid(vacate_after=0.1, grace=0.2)
    ignoring = tmp_path / "ignoring-sigterm"
    if stubborn:  # ignores SIGTERM, as a job too slow to checkpoint within the grace looks
        g.queue.submit([sys.executable, "-c", STUBBORN, str(ignoring)], b"seed", name="stubborn")
    else:
        g.hashchain(50_000_000)
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: agent.proc is not None and (ignoring.exists() or not stubborn))
    machine.touch_pts(0, time.time())  # the owner is back
    lines = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not any(line.startswith("yielded") for line in lines):
        lines.append(agent.step())
        time.sleep(0.05)
    [line] = [line for line in lines if line.startswith("yielded")]
    assert "()" not in line and "owner active" in line  # the old line said "yielded job 1 ():"
    agent.shutdown()


# -- a job's own cgroup (the real cgroup v2 hierarchy) -----------------------------------------

ESCAPER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    shared = sys.argv[1]
    # A grandchild that leaves the job's process group and session (setsid): only a
    # cgroup still holds it.
    writer = subprocess.Popen([sys.executable, "-c",
        "import sys, time\\nwhile True:\\n    open(sys.argv[1], 'a').write('x')\\n    time.sleep(0.02)",
        os.path.join(shared, "written")], start_new_session=True)
    with open(os.path.join(shared, "pids"), "a") as fh:
        fh.write(f"{os.getpid()} {writer.pid}\\n")
    while True:
        time.sleep(0.05)
    """
)


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@pytest.fixture
def work_slice(machine):
    """A real cgroup v2 directory standing in for the work slice, reachable under the fake
    root as /sys/fs/cgroup/<name> (the fake tree links to the real hierarchy)."""
    from support import IN_CI

    mount = _cgroup2_mount()
    name = f"eran-grid-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        if mount is None:
            raise OSError("no cgroup2 hierarchy mounted")
        (mount / name).mkdir()
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"cgroup v2 not writable in CI: {exc}")
        pytest.skip(f"cgroup v2 not writable here: {exc}")
    (machine.root / "sys/fs").mkdir(parents=True, exist_ok=True)
    (machine.root / "sys/fs/cgroup").symlink_to(mount)
    yield f"/sys/fs/cgroup/{name}", mount / name
    for child in (mount / name).iterdir() if (mount / name).exists() else []:
        if child.is_dir():
            with contextlib_suppress():
                (child / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 5
            while child.exists() and time.monotonic() < deadline:
                with contextlib_suppress():
                    child.rmdir()
                time.sleep(0.02)
    with contextlib_suppress():
        (mount / name).rmdir()


def contextlib_suppress():
    import contextlib

    return contextlib.suppress(OSError)


@pytest.mark.slow
def test_a_job_in_its_own_cgroup_is_frozen_not_stopped_and_nothing_escapes_a_kill_9(
    grid, machine, eran_grid_cmd, family: Path, tmp_path: Path, work_slice
) -> None:
    rel, real = work_slice
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    g = grid(lease_ttl=600, job_cgroup=rel)
    g.queue.submit([sys.executable, str(script), str(family)])
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: len(_pids(family)) == 1 and (family / "written").exists())
    [(job_pid, writer_pid)] = _pids(family)
    [cg] = [p for p in real.iterdir() if p.is_dir()]
    assert str(writer_pid) in (cg / "cgroup.procs").read_text()  # left the group, not the cgroup
    machine.touch_pts(0, time.time())  # the owner is back: pause
    line = agent.step()
    assert line.startswith("paused job")
    wait_for(lambda: "frozen 1" in (cg / "cgroup.events").read_text(), what="the job's cgroup to freeze")
    state = Path(f"/proc/{job_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state != "T"  # frozen, so the guard never adopts an owner pause as its own
    agent.shutdown()  # yields: the job is ended, the cgroup removed
    wait_for(lambda: not _alive(job_pid) and not _alive(writer_pid), what="the job and its escaped grandchild to end")

    # Now the hard way: a real agent killed with -9 while the job and the setsid'd grandchild run.
    (family / "pids").unlink()
    machine.touch_pts(0, time.time() - 3600)
    proc = _start_agent(eran_grid_cmd, g.config_file())
    try:
        wait_for(lambda: len(_pids(family)) == 1, what="the job to run again")
        [(job_pid, writer_pid)] = _pids(family)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        _stop(proc)
    wait_for(lambda: not _alive(job_pid) and not _alive(writer_pid), what="everything in the job's cgroup to die")
