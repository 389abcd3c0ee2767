"""The job's wrapper: runs the job as a stranger, carries its output back with live caps, then
writes its exit status atomically into the job's directory, whatever became of the agent
meanwhile (effectively once).

Started by the agent as ``python3 -I -S wrapper.py --dir WORKDIR --home HOME [--cgroup DIR]
[--uid N --gid N] [--stdout-max N] [--stderr-max N] [--file-max N] -- CMD...`` at the head of
a new session, so the wrapper, the job and everything the job starts share one process group
(and, where cgroup v2 is writable, one cgroup under the work slice, which the wrapper joins
before it starts the job). The agent may die (kill -9) at any moment: the wrapper is not tied
to it, so a job that finishes is still recorded in ``exit.json``, and a restarted agent
records that instead of running the job again. SIGTERM/SIGINT/SIGHUP are the job's to handle
(checkpoint and exit): the wrapper only keeps waiting.

A stranger (``--uid``/``--gid``): the job runs under a uid that owns nothing of the agent's,
no supplementary groups and no capabilities (the wrapper clears its ambient set first, so the
exec gets none). It can write only HOME (``work/<id>/home``, group shared with the
agent, so the agent can read its checkpoint). Its stdout and stderr are pipes to this wrapper, which
writes them to agent-owned files and enforces ``--stdout-max``/``--stderr-max`` while the job
runs: one byte over and the job is killed and the limit recorded in ``exit.json``
(``"limit"``). ``--file-max`` is the job's RLIMIT_FSIZE (no single file larger). When the job
has ended, everything left in its cgroup/group is killed and, in a forked child as the job's
uid, every process of that uid (the container where no cgroup is writable: a setsid daemon
leaves the group, never its uid), what the uid left in /tmp, /var/tmp and /dev/shm is
removed, and HOME is made removable by the agent (the job may have made directories only it
can open).

If the agent dies while the job still runs (kill -9, OOM), the kernel tells the wrapper
(PR_SET_PDEATHSIG) and the wrapper kills the job's whole group and cgroup, grandchildren
included: no orphan keeps computing a job whose lease will be handed to another node. If the
job has already finished, the wrapper records it regardless. Stdlib only, no imports from
its package: it runs as a plain file.

``exit.json``: ``{"schema": "alma.eran-grid-exit/1", "exit_code": N, "stdout_bytes": N,
"stdout_sha256": HEX, "finished": T[, "limit": TEXT]}`` (negative ``exit_code``: killed by
that signal), written to a temp file, fsync'd, renamed, directory fsync'd: present means
complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from typing import Any

SCHEMA = "alma.eran-grid-exit/1"
_PR_SET_PDEATHSIG = 1
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_state: dict[str, Any] = {"job": None, "cgroup": None, "uid": None, "gid": None, "home": None}
# Where a stranger can write besides its HOME (the unit's private /tmp and /var/tmp, the
# shared memory fs): what its uid left there goes with the job.
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


# A copy of almaboard.files.write_atomic kept on purpose: this file runs as `python3 -I -S`
# (no site-packages, not even its own directory on sys.path), so it imports the stdlib only.
def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
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


def _join_cgroup(cgroup: str) -> None:
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    except OSError as exc:  # the agent checked it was writable; say so and go on in the group
        print(f"eran-grid wrapper: cannot join {cgroup}: {exc}", file=sys.stderr)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _kill_everything() -> None:
    """The job's whole cgroup (cgroup.kill), every process of its uid (a stranger) and its
    process group, this wrapper included."""
    if _state["cgroup"]:
        try:
            with open(os.path.join(_state["cgroup"], "cgroup.kill"), "w") as fh:
                fh.write("1")
        except OSError:
            pass
    if _state["uid"] is not None:
        _as_job(_state["uid"], _state["gid"], _state["home"])
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _kill_job(_signum: int, _frame: object) -> None:
    """The agent died: end the job and everything it started, unless it already finished."""
    job = _state["job"]
    if job is None or job.poll() is not None:
        return
    _kill_everything()  # the wrapper included: there is nothing to record


def _die_with(parent: int) -> None:
    try:
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGUSR2)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the agent died before the death signal was armed
        os.kill(os.getpid(), signal.SIGUSR2)


def _others() -> list[int]:
    """Live processes of this job besides the wrapper: its cgroup's, else its process group's."""
    me, pids = os.getpid(), []
    if _state["cgroup"]:
        with contextlib.suppress(OSError), open(os.path.join(_state["cgroup"], "cgroup.procs")) as fh:
            pids = [int(p) for p in fh.read().split()]
    else:
        pgrp = str(os.getpgrp())
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    with open(f"/proc/{name}/stat") as fh:
                        rest = fh.read().rsplit(")", 1)[1].split()
                    if rest[2] == pgrp and rest[0] not in ("Z", "X"):
                        pids.append(int(name))
    return [p for p in pids if p != me]


def _kill_leftovers(timeout: float = 5.0) -> None:
    """What the job left running (a setsid daemon in our cgroup): killed before HOME is fixed."""
    deadline = time.monotonic() + timeout
    while (pids := _others()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _become(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _drop_capabilities() -> bool:
    """Empty this process's permitted, effective and inheritable sets (capset) and the ambient
    set; True when /proc says none is left. A switch between two non-root uids keeps every
    capability (capabilities(7)): an agent running as a non-root user with CAP_KILL would
    otherwise clean up as the job's uid with CAP_KILL, and kill(-1) would reach every process."""
    import ctypes

    libc = _libc()
    with contextlib.suppress(OSError, AttributeError):
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two __user_cap_data_struct, all zero
    with contextlib.suppress(OSError, AttributeError):
        libc.capset(header, data)
    return _no_capabilities()


def _no_capabilities() -> bool:
    try:
        with open("/proc/self/status") as fh:
            sets = {k: v.strip() for k, _, v in (line.partition(":") for line in fh)}
        return all(int(sets[k], 16) == 0 for k in ("CapPrm", "CapEff", "CapAmb"))
    except (OSError, KeyError, ValueError):
        return False


def _uid_alive(uid: int) -> bool:
    """A process of ``uid`` that is not a zombie is still there (as seen by that uid)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if os.stat(f"/proc/{name}").st_uid != uid or int(name) == os.getpid():
                    continue
                with open(f"/proc/{name}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        return True
    return False


def _remove_tree(top: str) -> None:
    """Remove ``top`` (a file, or a directory and all below it, made searchable first);
    symlinks are removed, never followed. Iterative: no depth is too deep."""
    stack = [(top, False)]
    while stack:
        path, listed = stack.pop()
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):
                os.unlink(path)
        elif listed:
            with contextlib.suppress(OSError):
                os.rmdir(path)
        else:
            with contextlib.suppress(OSError):
                os.chmod(path, 0o700)
            stack.append((path, True))
            with contextlib.suppress(OSError):
                stack.extend((os.path.join(path, name), False) for name in os.listdir(path))


def _as_job(uid: int, gid: int, home: str | None, timeout: float = 5.0) -> None:
    """In a child that becomes the job's uid (the owner of what the job made and ran):

    1. drop every capability, then kill every process of that uid (kill(-1) reaches exactly
       the processes the caller may signal: with no capability, its own uid's). The cgroup
       holds a setsid/double-fork daemon where one is writable; without one this is what does:
       the uid is the job's alone (one job at a time). If a capability cannot be dropped,
       kill(-1) is never called (it would reach every process): the cgroup is the clean-up;
    2. remove what the uid left in the shared temp directories (SHARED_TMP), so nothing
       carries over to the next job of the same uid and nothing accumulates there;
    3. make HOME removable by the agent: every directory rwx and every file rw for the group
       the two share (the job may have made directories only it can open). Symlinks are not
       followed."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            _become(uid, gid)
            deadline = time.monotonic() + timeout
            if not _drop_capabilities():
                print("eran-grid wrapper: capabilities kept: no kill(-1) clean-up", file=sys.stderr)
                deadline = 0.0
            while time.monotonic() < deadline:
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
                if not _uid_alive(uid):
                    break  # zombies only: their parents (or init) reap them
                time.sleep(0.01)
            if home is not None:
                for base in SHARED_TMP:
                    with contextlib.suppress(OSError), os.scandir(base) as it:
                        mine = [e.path for e in it if e.stat(follow_symlinks=False).st_uid == uid]
                    for path in mine:
                        _remove_tree(path)
                for dirpath, dirs, files in os.walk(home):
                    for name in dirs + files:
                        with contextlib.suppress(OSError):
                            path = os.path.join(dirpath, name)
                            if not os.path.islink(path):
                                os.chmod(path, 0o770 if name in dirs else 0o660)
        except OSError:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


class _Sink:
    """One of the job's output pipes into an agent-owned file, at most ``cap`` bytes."""

    def __init__(self, path: str, cap: int, what: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.cap, self.what, self.size = cap, what, 0
        self.sha = hashlib.sha256()

    def take(self, data: bytes) -> str:
        """Write ``data``; returns the limit exceeded ('' while within it)."""
        room = self.cap - self.size
        if len(data) > room:
            data = data[: max(0, room)]
            over = f"{self.what} over {self.cap} bytes: killed"
        else:
            over = ""
        if data:
            os.write(self.fd, data)
            self.sha.update(data)
            self.size += len(data)
        return over


def _pump(job: subprocess.Popen[bytes], out: _Sink, err: _Sink) -> str:
    """Copy the job's pipes until the job has exited and they are drained (a daemon it left
    holding them open does not keep the wrapper waiting); returns the limit it broke, or ''."""
    sel = selectors.DefaultSelector()
    assert job.stdout is not None and job.stderr is not None
    sinks = {job.stdout.fileno(): out, job.stderr.fileno(): err}
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    exited = False
    while sinks:
        events = sel.select(timeout=0 if exited else 0.2)
        if not events:
            if exited:
                break
            exited = job.poll() is not None
            continue
        for key, _ev in events:
            fd = int(key.fd)
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(fd)
                del sinks[fd]
                continue
            over = sinks[fd].take(data)
            if over:
                return over
    return ""


def _opt(opts: list[str], name: str) -> str | None:
    return opts[opts.index(name) + 1] if name in opts and opts.index(name) + 1 < len(opts) else None


def _write_exit(workdir: str, exit_code: int, out: _Sink, limit: str = "") -> None:
    """exit.json: how the job ended, what it printed (size, sha256) and any limit that ended it."""
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "exit_code": exit_code,
        "stdout_bytes": out.size,
        "stdout_sha256": out.sha.hexdigest(),
        "finished": time.time(),
    }
    if limit:
        record["limit"] = limit
    _write_atomic(os.path.join(workdir, "exit.json"), json.dumps(record).encode())


def main(argv: list[str]) -> int:
    if "--" not in argv or argv[:1] != ["--dir"]:
        print(
            "usage: wrapper.py --dir WORKDIR [--home DIR] [--cgroup DIR] [--uid N --gid N] -- CMD...", file=sys.stderr
        )
        return 2
    sep = argv.index("--")
    opts, command = argv[:sep], argv[sep + 1 :]
    workdir = opts[1]
    home = _opt(opts, "--home") or workdir
    cgroup = _opt(opts, "--cgroup")
    uid = int(_opt(opts, "--uid") or -1)
    gid = int(_opt(opts, "--gid") or -1)
    stdout_max = int(_opt(opts, "--stdout-max") or 1 << 62)
    stderr_max = int(_opt(opts, "--stderr-max") or 1 << 62)
    file_max = int(_opt(opts, "--file-max") or -1)
    if cgroup:
        _join_cgroup(cgroup)
    _state["cgroup"] = cgroup
    if uid >= 0:
        _state["uid"], _state["gid"], _state["home"] = uid, gid, home
        # The job must start with no capability: the agent's ambient set (CAP_SETUID, ...) is
        # cleared here, so the exec of the job (a non-root uid, no file caps) gets none.
        with contextlib.suppress(OSError, AttributeError):
            _libc().prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the job gets defaults on exec
    signal.signal(signal.SIGUSR2, _kill_job)
    me = json.dumps({"pid": os.getpid(), "pgid": os.getpgrp()}).encode()
    _write_atomic(os.path.join(workdir, "wrapper.json"), me)
    out = _Sink(os.path.join(workdir, "stdout"), stdout_max, "stdout")
    err = _Sink(os.path.join(workdir, "stderr"), stderr_max, "stderr")
    limit = ""
    stranger: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": [], "umask": 0o007} if uid >= 0 else {}

    import resource  # here, not in the child: as the stranger it may not read the interpreter's files

    def _limits() -> None:  # in the child, after fork: the wrapper's own writes are not limited
        if file_max >= 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_max, file_max))

    with open(os.path.join(home, "input"), "rb") as stdin:
        try:
            job = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=home,
                close_fds=True,
                preexec_fn=_limits if file_max >= 0 else None,
                **stranger,
            )
            _state["job"] = job
            _die_with(int(os.environ.get("ERAN_GRID_AGENT_PID", "0")) or os.getppid())
        except (OSError, subprocess.SubprocessError) as exc:
            err.take(f"cannot start {command[0]}: {getattr(exc, 'strerror', None) or exc}\n".encode())
            rc = 127
            job = None
    if job is not None:
        limit = _pump(job, out, err)
        if limit:
            with contextlib.suppress(OSError):
                err.take(f"\neran-grid: {limit}\n".encode())
            _write_exit(workdir, -signal.SIGKILL, out, limit)
            _kill_everything()  # the record is written: the job, its children and this wrapper go
        rc = job.wait()
    _kill_leftovers()
    if uid >= 0:
        _as_job(uid, gid, home)
    _write_exit(workdir, rc, out)
    if rc < 0:  # mirror the job's death to the agent's wait(): the same signal
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
