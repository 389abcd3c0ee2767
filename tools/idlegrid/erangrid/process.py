"""A job's processes: the wrapper, the job and whatever it starts, as one unit we can stop,
continue, terminate and kill as a whole, and find again after the agent died.

Containment: every job heads its own session (one process group: wrapper + job + its
children) and, where a cgroup v2 parent is writable (``job_cgroup_parent``, normally the
work slice), also its own cgroup there, which catches children that leave the group
(setsid, double fork). Pausing a job in a cgroup freezes it (``cgroup.freeze``) instead of
SIGSTOP, so the thermal guard, which adopts stopped processes of the work slice, never takes
a job the owner paused for one it paused itself. ``lease.json`` in the job directory (written
before the job starts) and the wrapper's ``wrapper.json`` let a restarted agent stop whatever
is left of the job (:func:`stop_leftovers`) and find its result (``exit.json``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from almaboard.files import read_json_object

WRAPPER = Path(__file__).with_name("wrapper.py")


def proc_state(pid: int, proc: Path = Path("/proc")) -> str:
    """The one-letter state from /proc/PID/stat ('T' = stopped), '' if gone."""
    try:
        with open(proc / str(pid) / "stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def proc_start(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Start time of a process (clock ticks since boot, /proc/PID/stat field 22), to tell a
    process from a later one that reuses its pid."""
    try:
        with open(proc / str(pid) / "stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    out: list[int] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(proc / name / "stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(rest) > 2 and rest[2] == str(pgid) and rest[0] not in ("Z", "X"):
            out.append(int(name))
    return out


def usable_cgroup_parent(parent: Path | None) -> Path | None:
    """``parent`` if it is a real, writable cgroup v2 directory, else None."""
    if parent is None or not (parent / "cgroup.procs").is_file() or not (parent / "cgroup.controllers").exists():
        return None
    return parent if os.access(parent, os.W_OK) else None


def own_cgroup(proc: Path, cgroup_root: Path) -> Path | None:
    """This process's cgroup v2 directory (``0::/path`` in /proc/self/cgroup) under the
    unified hierarchy at ``cgroup_root`` (or its ``unified`` mount on a hybrid system)."""
    try:
        lines = (proc / "self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if rel is None or ".." in rel.split("/"):
        return None
    root = cgroup_root / "unified" if (cgroup_root / "unified/cgroup.procs").exists() else cgroup_root
    return root / rel.strip("/") if rel.strip("/") else root


def _write(path: Path, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def kill_cgroup(cgroup: Path, timeout: float = 5.0) -> None:
    """Kill every process in ``cgroup`` (cgroup.kill where the kernel has it), then remove it."""
    if not cgroup.is_dir():
        return
    with contextlib.suppress(OSError):
        _write(cgroup / "cgroup.freeze", "0")  # a frozen task cannot die
    try:
        _write(cgroup / "cgroup.kill", "1")
    except OSError:
        for pid in (cgroup / "cgroup.procs").read_text().split() if (cgroup / "cgroup.procs").exists() else []:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            cgroup.rmdir()
            return
        except OSError:
            time.sleep(0.01)


def kill_group(pgid: int, timeout: float = 5.0) -> None:
    """SIGCONT then SIGKILL the whole process group, and wait until nothing of it is alive."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def stop_leftovers(workdir: Path, boot_id: str) -> str:
    """Stop whatever is left of the job that ran in ``workdir`` (a previous agent's): its
    cgroup and its process group. Returns what was done ('' when nothing was left)."""
    lease = read_json_object(workdir / "lease.json")
    wrapper = read_json_object(workdir / "wrapper.json")
    done = []
    if lease.get("boot_id") not in (None, boot_id):
        return ""  # another boot: every process of it is gone
    cg = lease.get("cgroup")
    if isinstance(cg, str) and cg and Path(cg).is_dir():
        kill_cgroup(Path(cg))
        done.append(f"killed cgroup {cg}")
    pgid = wrapper.get("pgid")
    if isinstance(pgid, int) and pgid > 1 and pgid != os.getpgrp():
        # The group's leader, if alive, must be the wrapper we started (pid reuse check).
        leader_alive = proc_state(pgid) not in ("", "Z", "X")
        ours = not leader_alive or proc_start(pgid) == lease.get("wrapper_start") or lease.get("wrapper_start") is None
        if ours and group_members(pgid):
            kill_group(pgid)
            done.append(f"killed process group {pgid}")
    return "; ".join(done)


@dataclass(frozen=True)
class Limits:
    """What the wrapper enforces while the job runs (0 = no limit)."""

    stdout_max: int = 0
    stderr_max: int = 0
    file_max: int = 0


@dataclass(frozen=True)
class Stranger:
    """The uid/gid a job runs under: owns nothing of the agent's (docs/eran-grid.md)."""

    uid: int
    gid: int


class JobProcess:
    def __init__(
        self,
        command: list[str],
        workdir: Path,
        input_path: Path,
        env: dict[str, str],
        cgroup_parent: Path | None = None,
        home: Path | None = None,
        stranger: Stranger | None = None,
        limits: Limits = Limits(),
    ) -> None:
        self.workdir = workdir
        self.stdout_path = workdir / "stdout"
        self.stderr_path = workdir / "stderr"
        self.exit_path = workdir / "exit.json"
        self.cgroup: Path | None = None
        parent = usable_cgroup_parent(cgroup_parent)
        if parent is not None:
            cg = parent / f"eran-grid-job-{workdir.name}"
            try:
                cg.mkdir(exist_ok=True)
                self.cgroup = cg
            except OSError:
                self.cgroup = None
        home = home or input_path.parent
        argv = [sys.executable, "-I", "-S", str(WRAPPER), "--dir", str(workdir), "--home", str(home)]
        if self.cgroup is not None:
            argv += ["--cgroup", str(self.cgroup)]
        if stranger is not None:
            argv += ["--uid", str(stranger.uid), "--gid", str(stranger.gid)]
        for flag, value in (
            ("--stdout-max", limits.stdout_max),
            ("--stderr-max", limits.stderr_max),
            ("--file-max", limits.file_max),
        ):
            if value:
                argv += [flag, str(value)]
        argv += ["--", *command]
        env = {**env, "ERAN_GRID_AGENT_PID": str(os.getpid())}
        with open(workdir / "wrapper.log", "wb") as log:
            # The wrapper arms its own death signal (it must finish recording a job that
            # finished); the job's output comes to it through pipes it caps.
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=workdir,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the wrapper leads the job's own group
        self.start_time = proc_start(self.pid)
        self.stopped = False

    def limit_hit(self) -> str:
        """The live limit the wrapper killed the job for ('' if none)."""
        return str(read_json_object(self.exit_path).get("limit") or "")

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def _freeze(self, on: bool) -> bool:
        if self.cgroup is None:
            return False
        try:
            _write(self.cgroup / "cgroup.freeze", "1" if on else "0")
            return True
        except OSError:
            return False

    def frozen(self) -> bool:
        if self.cgroup is None:
            return False
        with contextlib.suppress(OSError):
            return "frozen 1" in (self.cgroup / "cgroup.events").read_text()
        return False

    def stop(self, confirm: float = 0.1) -> bool:
        """Freeze the job's cgroup (or SIGSTOP its whole group) and wait briefly until the
        kernel shows it stopped: delivery is asynchronous, and "stopped" must mean stopped."""
        froze = self._freeze(True)
        if not froze:
            self._signal(signal.SIGSTOP)
        self.stopped = True
        deadline = time.monotonic() + confirm
        while True:
            if froze and self.frozen():
                return True
            state = proc_state(self.pid)
            if not froze and state in ("T", "t", "Z", "X", ""):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    def cont(self) -> None:
        self._freeze(False)
        self._signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self) -> None:
        """Ask for a checkpoint: continue first, a stopped process cannot handle SIGTERM."""
        self.cont()
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._freeze(False)
        self._signal(signal.SIGKILL)
        self.stopped = False
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def reap_group(self) -> None:
        """Kill anything the job left behind in its group (and cgroup) after it exited."""
        self._signal(signal.SIGKILL)
        if self.cgroup is not None:
            kill_cgroup(self.cgroup)
