"""Borrowed work runs as a stranger, each attack as a hostile tester ran it; every
test failed on the code before the fix.

(1) a job id is a path only after it matched its grammar: "/abs/dir" or ".." from a queue is
dead-lettered, nothing is removed; (2) a setsid/double-fork daemon lives in the job's cgroup,
a child of the agent's own delegated cgroup in alma-work.slice (the shipped unit's
properties), and dies with the job and with a kill -9 of the agent; (3) a job runs under a
uid that owns nothing of the agent's: it cannot rewrite another job's row or write the state
dir; (4) stdout is capped while the job runs (killed and recorded); `queue list` shows
job-controlled text only through the sanitizer; a corrupt queue is exit 2 with the path and
the fix, and `queue repair` moves it aside.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from support import IN_CI, wait_for

UNIT = Path(__file__).resolve().parents[2] / "tools/idlegrid/systemd/eran-grid.service"
STRANGER_UID = 61999  # unused on the test machine: the job's uid
# One uid for every test here, and a job's wrapper kills every process of its uid when it
# ends (kill(-1)): under pytest-xdist (--dist loadgroup) these tests run in one worker, in turn.
pytestmark = pytest.mark.xdist_group("stranger-uid")
# The stranger must be able to execute its interpreter: the system one (the venv's may live
# under root's 0700 home).
JOB_PY = "/usr/bin/python3"


def _need_root() -> None:
    if not os.access(JOB_PY, os.X_OK):
        pytest.skip(f"no {JOB_PY} for the stranger to run")
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI runs as root: the stranger tests must run")
        pytest.skip("switching a job to another uid needs root here")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# -- (1) job identity -----------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["/some/abs/dir", "..", ".", "a/b", "x" * 65, "", "job\n1", 7])
def test_a_queue_message_whose_id_is_not_a_job_id_is_dead_lettered(bad: object) -> None:
    from erangrid.jobs import parse_job

    job, why = parse_job(json.dumps({"id": bad, "command": ["true"]}).encode(), "seq-9")
    assert why and "job id" in why and job.id == "seq-9"  # the placeholder's key is the queue's own


def test_an_unchecked_job_id_never_becomes_a_path_the_agent_removes(grid, tmp_path: Path) -> None:
    from erangrid.agent import Agent
    from erangrid.jobs import Job, Lease

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    g = grid()

    class OneLease:
        failed: list[str] = []

        def open(self, node: str) -> int:
            return 0

        def ping(self) -> None:
            pass

        def claim(self, node: str) -> Lease | None:
            if self.failed:
                return None
            return Lease(Job(id=str(victim), command=["true"]), token="t")

        def heartbeat(self, lease: Lease, checkpoint: bytes | None) -> bool:
            return True

        def complete(self, lease, outcome) -> bool:
            return True

        def yield_(self, lease, checkpoint) -> None:
            pass

        def fail(self, lease: Lease, error: str, checkpoint: bytes | None) -> str:
            self.failed.append(error)
            return "dead"

        def close(self) -> None:
            pass

    backend = OneLease()
    agent = Agent(g.cfg, backend, log=g.lines.append)
    agent.start()
    for _ in range(3):
        agent.step()
    assert (victim / "precious").read_text() == "keep me"
    assert backend.failed and "job id" in backend.failed[0]


# -- (3) a stranger: no write to queue.db, the state dir, other jobs ------------------------------
FORGER = textwrap.dedent(
    """
    import json, os, sqlite3, sys
    queue, state_dir = sys.argv[1], sys.argv[2]
    out = {"uid": os.getuid(), "groups": os.getgroups()}
    try:
        db = sqlite3.connect(queue, timeout=1)
        db.execute("UPDATE jobs SET state='done', result=CAST('FORGED' AS BLOB) WHERE id != ?",
                   (os.environ["ERAN_GRID_JOB_ID"],))
        db.commit()
        out["forged"] = True
    except sqlite3.Error as exc:
        out["forged"] = f"refused: {exc}"
    try:
        with open(os.path.join(state_dir, "planted"), "w") as fh:
            fh.write("x")
        out["planted"] = True
    except OSError as exc:
        out["planted"] = f"refused: {exc.strerror}"
    with open(os.path.join(os.environ["HOME"], "checkpoint", "mine"), "w") as fh:
        fh.write("my own checkpoint")
    print(json.dumps(out))
    """
)


@pytest.fixture
def open_state(tmp_path: Path):
    """A state dir the stranger can traverse to (pytest's tmp dirs are 0700 root's, as /var/lib
    is not): the board's StateDirectoryMode=0711 under /var/lib, here under /tmp."""
    base = Path(tempfile.mkdtemp(prefix="i19-stranger-", dir="/tmp"))
    os.chmod(base, 0o711)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_job_runs_as_a_stranger_and_cannot_forge_another_jobs_row_or_write_the_state_dir(
    grid, tmp_path: Path, open_state: Path
) -> None:
    _need_root()
    script = open_state / "forger.py"
    script.write_text(FORGER)
    os.chmod(script, 0o644)
    state = open_state / "state"
    state.mkdir(mode=0o711)
    queue = state / "queue.db"
    g = grid(
        job_user=str(STRANGER_UID),
        state_dir=str(state),
        status_path=str(state / "status.json"),
        queue={"backend": "sqlite", "path": str(queue)},
    )
    victim = g.queue.submit([JOB_PY, "-c", "print('honest')"], priority=-1)
    forger = g.queue.submit([JOB_PY, str(script), str(queue), str(state)], priority=5)
    agent = g.agent()
    agent.start()
    try:
        g.drive(agent, lambda: g.queue.counts()["done"] == 2, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {g.lines[-6:]}; {g.queue.jobs()}") from None
    st, result, _, _ = g.queue.result(forger)
    out = json.loads(result or b"{}")
    assert out["uid"] == STRANGER_UID and out["groups"] == []
    assert out["forged"] != True and out["planted"] != True, out  # noqa: E712 - True, not truthy text
    assert g.queue.result(victim)[:2] == ("done", b"honest\n")  # it ran, nobody forged it
    assert not (state / "planted").exists()


def test_a_stranger_job_checkpoint_is_read_back_by_the_agent(grid, open_state: Path) -> None:
    _need_root()
    state = open_state / "state"
    state.mkdir(mode=0o711)
    g = grid(job_user=str(STRANGER_UID), state_dir=str(state), status_path=str(state / "s.json"),
             queue={"backend": "sqlite", "path": str(state / "queue.db")}, lease_ttl=0.6)  # fmt: skip
    job = g.queue.submit(
        [
            JOB_PY,
            "-c",
            "import os,time\nopen(os.environ['ERAN_GRID_CHECKPOINT_DIR']+'/c','w').write('7')\n"
            "time.sleep(1.5)\nprint(open(os.environ['ERAN_GRID_CHECKPOINT_DIR']+'/c').read())",
        ]  # fmt: skip
    )
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: (g.queue.jobs()[0]["checkpoint_bytes"] or 0) > 0, timeout=30)
    g.drive(agent, lambda: g.queue.counts()["done"] == 1, timeout=30)
    assert g.queue.result(job)[1] == b"7\n"
    assert list((state / "work").iterdir()) == []  # everything the stranger made was removable


# -- (4) live output caps, sanitized listings, a corrupt queue --------------------------------
def test_stdout_is_capped_while_the_job_runs(grid) -> None:
    g = grid(result_max_bytes=65536)
    job = g.queue.submit([sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('y' * 65536)"])
    agent = g.agent()
    agent.start()
    g.drive(agent, lambda: g.queue.counts()["queued"] + g.queue.counts()["dead"] == 1
            and g.queue.jobs()[0]["failures"] >= 1, timeout=30)  # fmt: skip
    [row] = g.queue.jobs()
    assert "stdout over 65536 bytes" in row["detail"], row
    assert list((g.cfg.state_dir / "work").iterdir()) == []  # and nothing of it stays on disk
    del job


def test_queue_list_shows_job_controlled_text_only_sanitized(grid, eran_grid_cmd) -> None:
    g = grid()
    g.queue.submit(["true"], name="\x1b]0;pwned\x07\x1b[2J\rFAKE  done")
    proc = subprocess.run(
        [*eran_grid_cmd, "--config", str(g.config_file()), "queue", "list"], capture_output=True, timeout=60
    )
    assert proc.returncode == 0
    assert b"\x1b" not in proc.stdout and b"\x07" not in proc.stdout and b"\r" not in proc.stdout
    assert b"pwned" in proc.stdout  # shown, as visible escapes


def _corrupt(queue: Path) -> None:
    db = sqlite3.connect(queue)
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    size = queue.stat().st_size
    with open(queue, "r+b") as fh:
        fh.seek(4096)
        fh.write(os.urandom(max(4096, size - 4096)))


def test_a_corrupt_queue_is_exit_2_with_the_path_and_the_fix_and_repair_moves_it_aside(grid, eran_grid_cmd) -> None:
    g = grid()
    for _ in range(200):
        g.queue.submit(["python3", "-c", "print('x' * 400)"], name="n" * 200)
    g.queue.close()
    queue = g.cfg.queue.path
    _corrupt(queue)
    cfg = str(g.config_file())
    for verb in (["queue", "list"], ["run", "--steps", "3"]):
        proc = subprocess.run([*eran_grid_cmd, "--config", cfg, *verb], capture_output=True, timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and "Traceback" not in err, err
        assert str(queue) in err and "eran-grid queue repair" in err
    assert queue.exists()  # nothing moved without the explicit verb
    proc = subprocess.run([*eran_grid_cmd, "--config", cfg, "queue", "repair"], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not queue.exists() and [p.name.split(".corrupt-")[0] for p in queue.parent.glob("queue.db.corrupt-*")]
    proc = subprocess.run([*eran_grid_cmd, "--config", cfg, "queue", "list"], capture_output=True, timeout=60)
    assert proc.returncode == 0


def test_the_unit_does_not_restart_on_a_corrupt_queue() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    assert "2" in unit["Service"]["RestartPreventExitStatus"].split()


# -- (2) containment under the shipped unit's properties, on the real cgroup v2 -------------------
DAEMON = textwrap.dedent(
    """
    import os, sys, time
    shared = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(shared, "daemon.pid"), "w") as fh:
                fh.write(str(os.getpid()))
            while True:
                with open(os.path.join(shared, "ticks"), "a") as fh:
                    fh.write("x")
                time.sleep(0.02)
        os._exit(0)
    time.sleep(float(sys.argv[2]))
    print("job done")
    """
)


def _unit_service() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@pytest.fixture
def service_cgroup(machine):
    """A real cgroup standing for eran-grid.service's delegated cgroup in alma-work.slice; the
    fake root's /sys/fs/cgroup is the real hierarchy (as the agent sees it on the board)."""
    mount = _cgroup2_mount()
    base = None
    try:
        if mount is None:
            raise OSError("no cgroup2 hierarchy mounted")
        base = mount / f"i19-alma-work-{os.getpid()}-{time.monotonic_ns()}.slice"
        (base / "eran-grid.service").mkdir(parents=True)
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"cgroup v2 not writable in CI: {exc}")
        pytest.skip(f"cgroup v2 not writable here: {exc}")
    (machine.root / "sys/fs").mkdir(parents=True, exist_ok=True)
    (machine.root / "sys/fs/cgroup").symlink_to(mount)
    yield base / "eran-grid.service"
    for cg in sorted(base.rglob("*"), key=lambda p: -len(p.parts)):
        if cg.is_dir():
            with contextlib.suppress(OSError):
                (cg / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 5
            while cg.exists() and time.monotonic() < deadline:
                try:
                    cg.rmdir()
                except OSError:
                    time.sleep(0.02)
    with contextlib.suppress(OSError):
        base.rmdir()


@pytest.mark.slow
def test_a_setsid_daemon_stays_in_the_jobs_cgroup_freezes_with_it_and_dies_with_a_kill_9_of_the_agent(
    grid, machine, eran_grid_cmd, tmp_path: Path, service_cgroup: Path
) -> None:
    svc = _unit_service()
    # The shipped unit's properties that make this possible (what the test reproduces):
    assert svc["Slice"] == "alma-work.slice" and svc["Delegate"] == "yes"
    assert svc.get("ProtectControlGroups", "no") == "no" and svc["KillMode"] == "control-group"
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    shared = tmp_path / "shared"
    shared.mkdir()
    g = grid(lease_ttl=600)  # no job_cgroup: the default, "auto" = the agent's own cgroup
    g.queue.submit([sys.executable, str(script), str(shared), "600"])
    launcher = (
        "import os, sys\n"
        f"open({str(service_cgroup / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, *eran_grid_cmd, "--config", str(g.config_file()), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: (shared / "daemon.pid").exists() and (shared / "ticks").exists(), what="the daemon")
        daemon = int((shared / "daemon.pid").read_text())
        [job_cg] = [p for p in service_cgroup.iterdir() if p.is_dir()]
        assert str(daemon) in (job_cg / "cgroup.procs").read_text()  # left its session, not the cgroup
        # The guard freezes the slice: the daemon stops computing with everything else.
        (service_cgroup.parent / "cgroup.freeze").write_text("1")
        wait_for(lambda: "frozen 1" in (job_cg / "cgroup.events").read_text(), what="the slice to freeze")
        size = (shared / "ticks").stat().st_size
        time.sleep(0.3)
        assert (shared / "ticks").stat().st_size == size
        (service_cgroup.parent / "cgroup.freeze").write_text("0")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not _alive(daemon), what="the daemon to die with the agent")


def test_the_one_place_a_job_id_becomes_a_path_is_job_dir() -> None:
    """The grep-able rule of docs/architecture.md, "No path from unvalidated text"."""
    src = Path(__file__).resolve().parents[2] / "tools/idlegrid/erangrid"
    hits = [(p.name, line) for p in src.glob("*.py") for line in p.read_text().splitlines() if '"work" /' in line]
    assert hits == [("jobs.py", '    return state_dir / "work" / job_id')]


# -- (2b) without a writable cgroup, the stranger's uid is the container ----------------------
ESCAPER = textwrap.dedent(
    """
    import os, sys, time
    shared = sys.argv[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(os.path.join("/tmp", "i19-left-" + os.environ["ERAN_GRID_JOB_ID"]), "w").write("x" * 4096)
            with open(os.path.join(shared, "daemon.pid"), "w") as fh:
                fh.write(str(os.getpid()))
            while True:
                time.sleep(0.05)
        os._exit(0)
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(shared, "daemon.pid")) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("job done")
    """
)


def _without_a_cgroup(grid, open_state: Path, name: str, source: str, **over: object):
    """A grid whose stranger jobs get no writable cgroup (job_cgroup = ""): the job's script,
    a world-writable directory it reports into, the agent's state dir 0711 as the unit makes it."""
    script = open_state / name
    script.write_text(source)
    os.chmod(script, 0o644)
    shared = open_state / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    state = open_state / "state"
    state.mkdir(mode=0o711)
    g = grid(job_user=str(STRANGER_UID), job_cgroup="", state_dir=str(state), status_path=str(state / "s.json"),
             queue={"backend": "sqlite", "path": str(state / "queue.db")}, **over)  # fmt: skip
    return g, script, shared


def test_a_setsid_daemon_of_a_stranger_job_dies_with_the_job_without_a_cgroup_and_leaves_nothing_in_tmp(
    grid, open_state: Path
) -> None:
    """No writable cgroup (job_cgroup = "", or a board without delegation): the process group
    is all the old wrapper watched, and a double-fork + setsid daemon kept running as eran-job
    after its job was recorded, free to ptrace or feed the next job of the same uid, and its
    file in the shared /tmp stayed for the next job to read."""
    _need_root()
    g, script, shared = _without_a_cgroup(grid, open_state, "escaper.py", ESCAPER)
    job = g.queue.submit([JOB_PY, str(script), str(shared)])
    left = Path("/tmp") / f"i19-left-{job}"
    agent = g.agent()
    agent.start()
    daemon = 0
    try:
        g.drive(agent, lambda: g.queue.counts()["done"] == 1, timeout=60)
        assert g.queue.result(job)[1] == b"job done\n"
        daemon = int((shared / "daemon.pid").read_text())
        wait_for(lambda: not _alive(daemon), what="the stranger's daemon to die with its job")
        assert not left.exists()  # what the stranger left in the shared /tmp went with it
    finally:
        if daemon and _alive(daemon):
            os.kill(daemon, signal.SIGKILL)
        with contextlib.suppress(OSError):
            left.unlink()


@pytest.mark.slow
def test_a_setsid_daemon_of_a_stranger_job_dies_with_a_kill_9_of_the_agent_without_a_cgroup(
    grid, eran_grid_cmd, open_state: Path
) -> None:
    """The agent killed (kill -9) while its job runs: the wrapper's death signal killed the
    group only, and the old job's setsid daemon computed on, unowned."""
    _need_root()
    g, script, shared = _without_a_cgroup(grid, open_state, "daemon.py", DAEMON, lease_ttl=600)
    g.queue.submit([JOB_PY, str(script), str(shared), "600"])
    proc = subprocess.Popen([*eran_grid_cmd, "--config", str(g.config_file()), "run"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    daemon = 0
    try:
        wait_for(lambda: (shared / "daemon.pid").exists() and (shared / "ticks").exists(), what="the daemon")
        daemon = int((shared / "daemon.pid").read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not _alive(daemon), what="the daemon to die with the agent")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if daemon and _alive(daemon):
            os.kill(daemon, signal.SIGKILL)


# -- (3b) the checkpoint directory is the job's: the agent never follows it elsewhere -------------
SWAPPER = textwrap.dedent(
    """
    import os, sys, time
    ck = os.environ["ERAN_GRID_CHECKPOINT_DIR"]
    os.rename(ck, ck + "-mine")
    os.symlink(sys.argv[1], ck)  # the agent packs "its checkpoint" from the agent's secrets
    time.sleep(2.5)
    print("done")
    """
)


def test_a_checkpoint_dir_swapped_for_a_symlink_never_packs_the_agents_files(grid, tmp_path: Path) -> None:
    """The job owns HOME, so it can replace its checkpoint directory with a symlink to a
    directory only the agent can read (its NATS credentials, the state dir with queue.db):
    the old agent packed those files into the job's checkpoint, handed back to the job at its
    next attempt (and stored in the queue for everyone who reads it)."""
    secrets = tmp_path / "agent-secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "nats.creds").write_text("SUAAGENTSEEDNEVERFORJOBS")
    g = grid(lease_ttl=0.6)
    job = g.queue.submit([sys.executable, "-c", SWAPPER, str(secrets)])
    agent = g.agent()
    agent.start()
    seen: list[bytes] = []

    def stored() -> bool:
        row = g.queue._connect().execute("SELECT checkpoint FROM jobs WHERE id = ?", (job,)).fetchone()
        if row and row[0]:
            seen.append(bytes(row[0]))
        return g.queue.counts()["done"] == 1

    g.drive(agent, stored, timeout=60)
    assert not any(b"nats.creds" in blob for blob in seen), seen[-1][:200]
    assert any("checkpoint not saved" in line for line in g.lines), g.lines[-6:]
