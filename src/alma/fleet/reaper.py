"""Runs ON THE NODE (sent as ``python3 -c``): the health command's whole process tree ends
by the deadline, including children that called ``setsid()`` or outlived their parent.

Usage: python3 -c <this source> LIMIT_S KILL_AFTER_S COMMAND

It makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every orphaned descendant
is re-parented to it rather than to init, wherever it moved its session or process group;
it runs COMMAND with ``sh -c`` and, when COMMAND ends or LIMIT_S passes (whichever is
first), sends SIGTERM to every process still below it, SIGKILL KILL_AFTER_S later, and
reaps them. Exit code: COMMAND's, or 124 on timeout (as coreutils ``timeout``).

LIMIT_S counts from the start of the ssh session, not of this program: the login shell
``exec``-s it, so this process IS that shell and its start time (``/proc/self/stat``) is
when sshd started it, before the account's rc files ran. An rc file that hung past the
deadline leaves no time at all: exit 124 at once, the command never runs (alma gave up on
it long ago). Node-local clocks only (time since boot), so the desktop's clock is no part of it.
A shell that never gets here (its rc file hangs and ignores signals) is ended by the board
itself on ALMA-OS: the connection's sshd@.service cgroup is killed when alma's ssh goes away
(alma-access's drop-in, docs/fleet.md).
What remains out of reach (docs/fleet.md): work handed to another daemon (systemd-run, at,
cron, a container engine) and processes of another user (sudo) that it may not signal.
Stdlib only; it must run on the board's python3 (3.12) and any older one (3.8+), started
with ``-I -S`` (no site, no PYTHON* variables). It starts at every remote call (alma update
makes a dozen per board), so it keeps its imports few: the command is started with
``os.posix_spawnp`` as ``subprocess`` would (new session, SIGPIPE and SIGXFSZ back to their
defaults, no inherited descriptor above 2), without importing ``subprocess`` (measured on a
virtual board: about 10 ms of its 23 ms of CPU).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def descendants(root: int) -> list[int]:
    """Pids below ``root`` (from /proc: ppid links; orphans are re-parented to root)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields and fields[0] != b"Z":
            kids.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in kids.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def end_tree(kill_after: float, kill_for: float = 5.0) -> None:
    """SIGTERM to the tree, then SIGKILL, and SIGKILL again to whatever appeared since.

    A process that ignores SIGTERM and forks in a loop adds children between one scan of
    /proc and the kills: one SIGKILL round left them orphaned here and then, when the
    reaper exited, under init. So the tree is re-scanned and killed until it is empty
    (orphans come to this subreaper, so each scan sees them), for at most ``kill_for`` s.
    """
    me = os.getpid()
    pids = descendants(me)
    if pids:
        signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + kill_after
        while time.monotonic() < deadline and descendants(me):
            reap()
            time.sleep(0.05)
    deadline = time.monotonic() + kill_for
    while True:
        reap()
        pids = descendants(me)
        if not pids or time.monotonic() > deadline:
            break
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.02)
    reap()


class Stopped(Exception):
    """SIGTERM/SIGHUP to the reaper, or its deadline (SIGALRM): end the tree now."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped()


def session_age() -> float:
    """Seconds since this process (the session's login shell, exec'd into us) started."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        with open("/proc/uptime", "rb") as fh:
            up = float(fh.read().split()[0])
        started = int(stat[stat.rfind(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0  # no /proc: the limit counts from here
    return max(0.0, up - started)


def inherited_fds() -> list[int]:
    """Descriptors above 2 a child would inherit (what ``subprocess``'s close_fds closes)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    out = []
    for name in names:
        fd = int(name)
        with contextlib.suppress(OSError):  # the listing's own descriptor is closed by now
            if fd > 2 and os.get_inheritable(fd):
                out.append(fd)
    return out


def spawn(command: str) -> int:
    """``sh -c command`` in a session of its own, signals as a fresh program expects them."""
    sigdef = [signal.SIGPIPE] + ([signal.SIGXFSZ] if hasattr(signal, "SIGXFSZ") else [])  # Python ignores both
    return os.posix_spawnp(
        "sh", ["sh", "-c", command], dict(os.environ), setsid=True, setsigdef=sigdef,
        file_actions=[(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited_fds()],
    )  # fmt: skip


def main(argv: list[str]) -> int:
    limit, kill_after, command = float(argv[0]), float(argv[1]), argv[2]
    limit -= session_age()
    if limit <= 0:
        return 124  # the rc files took the whole deadline: alma gave up; run nothing
    with contextlib.suppress(OSError, AttributeError):  # no prctl: only what stays a child is ended
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, _stop)
    child = spawn(command)
    code, status = 124, None
    with contextlib.suppress(Stopped):
        signal.setitimer(signal.ITIMER_REAL, limit)  # the deadline: SIGALRM ends the wait
        _, status = os.waitpid(child, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN)  # the clean-up itself is not interrupted
    if status is not None:
        code = os.waitstatus_to_exitcode(status)
    end_tree(kill_after)
    if status is None:
        with contextlib.suppress(ChildProcessError):  # end_tree may have reaped it already
            os.waitpid(child, 0)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
