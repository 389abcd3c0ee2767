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
Stdlib only; it must run on the board's python3 (3.12) and any older one (3.8+).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
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
    """SIGTERM/SIGHUP to the reaper: end the tree now."""


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


def main(argv: list[str]) -> int:
    limit, kill_after, command = float(argv[0]), float(argv[1]), argv[2]
    limit -= session_age()
    if limit <= 0:
        return 124  # the rc files took the whole deadline: alma gave up; run nothing
    with contextlib.suppress(OSError, AttributeError):  # no prctl: only what stays a child is ended
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    child = subprocess.Popen(["sh", "-c", command], start_new_session=True)
    code = 124
    with contextlib.suppress(subprocess.TimeoutExpired, Stopped):
        code = child.wait(timeout=limit)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the clean-up itself is not interrupted
    end_tree(kill_after)
    if child.returncode is None:
        child.wait()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
