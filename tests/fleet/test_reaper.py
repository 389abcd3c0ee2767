"""The on-node reaper (alma.fleet.reaper), run locally: the whole tree ends by the deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from alma.fleet import reaper

REAPER = Path(reaper.__file__)


def _alive_sleeps(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] != "Z" and b"sleep" in cmd:
            out.append(pid)
    return out


def test_a_tree_that_ignores_sigterm_and_forks_in_a_loop_is_ended(tmp_path: Path) -> None:
    """A child that ignores SIGTERM and forks without pause adds
    orphans between the reaper's scan and its SIGKILLs; one kill round left them behind (under
    init once the reaper exited). Every one of them must be gone when the reaper returns."""
    pids_file = tmp_path / "pids"
    script = tmp_path / "forker.sh"
    script.write_text(f"trap '' TERM\nwhile :; do (sleep 300 & echo $! >> {pids_file}); done\n")
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(REAPER), "1", "0.5", f"sh {script}"], timeout=120)
        took = time.monotonic() - started
        assert proc.returncode == 124
        time.sleep(0.3)
        pids = [int(x) for x in pids_file.read_text().split()]
        assert len(pids) > 3  # it did fork in a loop
        assert _alive_sleeps(pids) == [], "children forked during the kill escaped the deadline"
        assert took < 60
    finally:
        if pids_file.exists():
            for pid in _alive_sleeps([int(x) for x in pids_file.read_text().split()]):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def test_the_deadline_counts_from_the_session_shell_so_a_slow_rc_file_runs_nothing(tmp_path: Path) -> None:
    """sshd's login shell reads the account's rc files, then ``exec``-s the reaper (same pid,
    same start time). Here the shell spends 3 s before the exec, as a hanging ~/.bashrc does,
    against a 2 s limit. Before: the reaper gave the command its full 2 s after that, long
    after alma had given up; now the limit is spent and nothing runs (exit 124)."""
    marker = tmp_path / "health-ran"
    script = f'sleep 3; exec "$0" -c "$1" 2 1 "touch {marker}"'
    r = subprocess.run(["bash", "-c", script, sys.executable, REAPER.read_text()], timeout=120, check=False)
    assert r.returncode == 124 and not marker.exists()
    ok = subprocess.run(["bash", "-c", f'exec "$0" -c "$1" 30 1 "touch {marker}"', sys.executable,
                         REAPER.read_text()], timeout=120, check=False)  # fmt: skip
    assert ok.returncode == 0 and marker.exists()  # a quick shell keeps its time


def test_the_command_starts_as_a_fresh_program_would(tmp_path: Path) -> None:
    """The reaper starts the command without ``subprocess`` (its import was half the reaper's
    start) and keeps what ``subprocess`` gave it: a session of its own, SIGPIPE and SIGXFSZ at
    their defaults (Python ignores both: ``yes | head`` would complain instead of ending), and
    no descriptor above 2 from the reaper (here one left inheritable on purpose)."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    cmd = f"cat /proc/$$/stat > {tmp_path}/stat; cat /proc/$$/status > {tmp_path}/status; ls /proc/$$/fd > {tmp_path}/f"
    try:
        proc = subprocess.run([sys.executable, "-I", "-S", str(REAPER), "60", "1", cmd], pass_fds=(w,), timeout=120)
    finally:
        os.close(r)
        os.close(w)
    assert proc.returncode == 0
    stat = (tmp_path / "stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    assert fields[3] == stat.split()[0]  # session id == the shell's pid: a session of its own
    sig_ign = next(ln for ln in (tmp_path / "status").read_text().splitlines() if ln.startswith("SigIgn:"))
    ignored = int(sig_ign.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
    assert str(w) not in (tmp_path / "f").read_text().split()


def test_the_deadline_ends_the_command_and_its_exit_code_is_passed_on(tmp_path: Path) -> None:
    """The wait is bounded by the limit (an alarm, no subprocess timeout): exit 124 at the
    deadline, the command's own code otherwise (a signal's as a negative, as before)."""
    assert subprocess.run([sys.executable, "-I", "-S", str(REAPER), "60", "1", "exit 7"], timeout=120).returncode == 7
    slow = subprocess.run([sys.executable, "-I", "-S", str(REAPER), "1", "1", "sleep 300"], timeout=120)
    assert slow.returncode == 124
    killed = subprocess.run([sys.executable, "-I", "-S", str(REAPER), "60", "1", "kill -9 $$"], timeout=120)
    assert killed.returncode == 256 - signal.SIGKILL
