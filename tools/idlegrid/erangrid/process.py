"""A job's processes: one process group we can stop, continue, terminate and kill as a whole."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_agent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # If the agent is killed (-9, OOM), the kernel kills the job too: no orphan keeps running a
    # job whose lease will expire and be claimed again elsewhere.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class JobProcess:
    def __init__(self, command: list[str], workdir: Path, input_path: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.stdout_path = workdir / "stdout"
        self.stderr_path = workdir / "stderr"
        with open(input_path, "rb") as stdin, open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # Files, not pipes: a stopped agent can never block the job on a full pipe.
            self.popen = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_agent,
                close_fds=True,
            )
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the job leads its own group
        self.stopped = False

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def stop(self, confirm: float = 0.1) -> bool:
        """SIGSTOP the whole group and wait (briefly) until the kernel shows the leader
        stopped: the signal is delivered asynchronously, and "stopped" must mean stopped."""
        self._signal(signal.SIGSTOP)
        self.stopped = True
        deadline = time.monotonic() + confirm
        while True:
            state = proc_state(self.pid)
            if state in ("T", "t", "Z", "X", ""):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    def cont(self) -> None:
        self._signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self) -> None:
        """Ask for a checkpoint: continue first, a stopped process cannot handle SIGTERM."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        self.stopped = False

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self.stopped = False

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def reap_group(self) -> None:
        """Kill anything the job left behind in its group after it exited."""
        self._signal(signal.SIGKILL)


def proc_state(pid: int, proc: Path = Path("/proc")) -> str:
    """The one-letter state from /proc/PID/stat ('T' = stopped), '' if gone."""
    try:
        with open(proc / str(pid) / "stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
