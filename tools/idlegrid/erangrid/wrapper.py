"""The job's wrapper: runs the job, then writes its exit status atomically into the job's
directory, whatever became of the agent meanwhile (effectively once).

Started by the agent as ``python3 -I -S wrapper.py --dir WORKDIR [--cgroup DIR] -- CMD...``
at the head of a new session, so the wrapper, the job and everything the job starts share
one process group (and, where cgroup v2 is writable, one cgroup under the work slice, which
the wrapper joins before it starts the job). The agent may die (kill -9) at any moment: the
wrapper is not tied to it, so a job that finishes is still recorded in ``exit.json``, and a
restarted agent records that instead of running the job again. SIGTERM/SIGINT/SIGHUP are
the job's to handle (checkpoint and exit): the wrapper only keeps waiting.

If the agent dies while the job still runs (kill -9, OOM), the kernel tells the wrapper
(PR_SET_PDEATHSIG) and the wrapper kills the job's whole group and cgroup, grandchildren
included: no orphan keeps computing a job whose lease will be handed to another node. If the
job has already finished, the wrapper records it regardless. Stdlib only, no imports from
its package: it runs as a plain file.

``exit.json``: ``{"schema": "alma.eran-grid-exit/1", "exit_code": N, "stdout_bytes": N,
"stdout_sha256": HEX, "finished": T}`` (negative ``exit_code``: killed by that signal),
written to a temp file, fsync'd, renamed, directory fsync'd: present means complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

SCHEMA = "alma.eran-grid-exit/1"


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _digest(path: str) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 16):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _join_cgroup(cgroup: str) -> None:
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    except OSError as exc:  # the agent checked it was writable; say so and go on in the group
        print(f"eran-grid wrapper: cannot join {cgroup}: {exc}", file=sys.stderr)


_PR_SET_PDEATHSIG = 1
_state: dict[str, Any] = {"job": None, "cgroup": None}


def _kill_job(_signum: int, _frame: object) -> None:
    """The agent died: end the job and everything it started, unless it already finished."""
    job = _state["job"]
    if job is None or job.poll() is not None:
        return
    if _state["cgroup"]:
        try:
            with open(os.path.join(_state["cgroup"], "cgroup.kill"), "w") as fh:
                fh.write("1")
        except OSError:
            pass
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the wrapper included: there is nothing to record


def _die_with(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGUSR2)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the agent died before the death signal was armed
        os.kill(os.getpid(), signal.SIGUSR2)


def main(argv: list[str]) -> int:
    if "--" not in argv or argv[:1] != ["--dir"]:
        print("usage: wrapper.py --dir WORKDIR [--cgroup DIR] -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    sep = argv.index("--")
    opts, command = argv[:sep], argv[sep + 1 :]
    workdir = opts[1]
    cgroup = opts[opts.index("--cgroup") + 1] if "--cgroup" in opts else None
    if cgroup:
        _join_cgroup(cgroup)
    _state["cgroup"] = cgroup
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the job gets defaults on exec
    signal.signal(signal.SIGUSR2, _kill_job)
    me = json.dumps({"pid": os.getpid(), "pgid": os.getpgrp()}).encode()
    _write_atomic(os.path.join(workdir, "wrapper.json"), me)
    with (
        open(os.path.join(workdir, "input"), "rb") as stdin,
        open(os.path.join(workdir, "stdout"), "wb") as out,
        open(os.path.join(workdir, "stderr"), "wb") as err,
    ):
        try:
            job = subprocess.Popen(command, stdin=stdin, stdout=out, stderr=err, cwd=workdir, close_fds=True)
            _state["job"] = job
            _die_with(int(os.environ.get("ERAN_GRID_AGENT_PID", "0")) or os.getppid())
        except OSError as exc:
            err.write(f"cannot start {command[0]}: {exc.strerror}\n".encode())
            err.flush()
            rc = 127
            job = None
    if job is not None:
        rc = job.wait()
    size, sha = _digest(os.path.join(workdir, "stdout"))
    record = {"schema": SCHEMA, "exit_code": rc, "stdout_bytes": size, "stdout_sha256": sha, "finished": time.time()}
    _write_atomic(os.path.join(workdir, "exit.json"), json.dumps(record).encode())
    if rc < 0:  # mirror the job's death to the agent's wait(): the same signal
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
