"""A health session ends on the board when alma gives up, whatever the account's rc files do.

The board runs sshd as the image does (one sshd@.service per connection, no PAM), so every
process of a session lives in that unit's cgroup. The admin's rc file hangs and ignores every
signal sshd or a shell would send (`trap '' HUP TERM INT PIPE`): the health command never
starts, alma's deadline passes, alma stops its ssh. Before the image's sshd@.service drop-in
(alma-access, 50-alma-session-end.conf) the stuck shells lived on (for ever with the image's
KillMode=process); with it systemd ends the unit's whole cgroup, SIGKILL last. A client that
stops answering without closing the connection is dropped by sshd's keepalives
(50-alma-client-alive.conf), and its session then ends the same way.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from support import run_cli
from support_lab import WAIT_S, sh, virtual_fleet, virtual_lab, wait_for

from alma.lab import board as lab

pytestmark = pytest.mark.slow

# Long enough for an ssh login on a loaded host (the shell must reach the rc file before
# alma gives up, or there is nothing to end); the rc file holds far longer.
DEADLINE_S = 15
# The rc file notes that it was reached, then ignores every catchable signal and hangs.
HANG = "echo $$ >> ~/rc-reached\ntrap '' HUP TERM INT PIPE\nsleep 1000\n"


def _as_admin(b: lab.Board, path: str, text: str) -> None:
    home = f"/home/{lab.ADMIN}"
    sh(b, "sh", "-c", f"printf %s {shlex.quote(text)} > {home}/{path} && chown {lab.ADMIN}: {home}/{path}")


def _leftovers(b: lab.Board) -> list[str]:
    """Whatever of an ssh session still runs: the admin's processes (without PAM the admin has
    no user manager: every one is a session's) and sshd's per-connection units (their cgroups
    hold sudo's root children too)."""
    # A look that failed (nsenter racing the board's init) counts as "still there": asked again.
    procs = sh(b, "ps", "-u", lab.ADMIN, "-o", "pid=,args=", check=False).splitlines()
    units = b.exec(["systemctl", "list-units", "sshd@*", "--all", "--plain", "--no-legend", "--no-pager"], check=False)
    failed = [f"(systemctl exited {units.returncode}: {units.lines[-1:]})"] if units.returncode else []
    return [line for line in procs + units.lines + failed if line.strip()]


def _wait_gone(b: lab.Board, what: str, timeout: float = WAIT_S) -> None:
    try:
        wait_for(what, lambda: not _leftovers(b), timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still there: {_leftovers(b)}") from None


def _health(capsys: pytest.CaptureFixture[str], fleet: Path, *extra: str) -> dict[str, object]:
    _, out, err = run_cli(capsys, "fleet", "health", "--fleet", fleet, "--json", "--no-save", *extra)
    nodes = json.loads(out)["nodes"]
    assert len(nodes) == 1, out + err
    return nodes[0]  # type: ignore[no-any-return]


def _reached(b: lab.Board) -> int:
    """How many sessions reached the rc file (read through the board's root from here)."""
    notes = b.root / "home" / lab.ADMIN / "rc-reached"
    return len(notes.read_text().split()) if notes.exists() else 0


def test_a_hanging_rc_file_that_traps_signals_leaves_nothing_once_alma_gave_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with virtual_fleet(1, image_sshd=True) as (fleet, [board]):
        # An admin who logs in with bash (Debian's bash reads ~/.bashrc for an ssh command).
        sh(board, "usermod", "--shell", "/bin/bash", lab.ADMIN)
        _as_admin(board, ".bashrc", HANG)
        for _ in range(3):
            node = _health(capsys, fleet, "--timeout", str(DEADLINE_S))
            assert node["status"] == "UNKNOWN" and "within" in str(node["summary"]), node
        assert _reached(board) >= 1, "no session reached the rc file before its deadline: nothing was tested"
        _wait_gone(board, "no process or unit of the three sessions left on the board")

        # The image's own shell (/bin/sh reads no rc file for a command) and the rc file sshd
        # itself runs before the command: ~/.ssh/rc.
        sh(board, "usermod", "--shell", "/bin/sh", lab.ADMIN)
        sh(board, "rm", f"/home/{lab.ADMIN}/.bashrc")
        _as_admin(board, ".ssh/rc", HANG)
        before = _reached(board)
        for _ in range(3):  # a login slower than the deadline on a loaded host reaches nothing: again
            node = _health(capsys, fleet, "--timeout", str(DEADLINE_S))
            assert node["status"] == "UNKNOWN" and "within" in str(node["summary"]), node
            if _reached(board) > before:
                break
        assert _reached(board) > before, "no session reached ~/.ssh/rc before its deadline"
        _wait_gone(board, "no process or unit of the ~/.ssh/rc session left on the board")

        # Fixed: the next run is answered, at the fleet's own deadline.
        sh(board, "rm", f"/home/{lab.ADMIN}/.ssh/rc")
        node = _health(capsys, fleet)
        assert node["status"] == "OK", node
        _wait_gone(board, "the answered session gone too")


def test_a_client_that_stops_answering_is_dropped_and_its_stuck_session_ended() -> None:
    """The desktop vanishes mid-run (powered off, cut off): no FIN ever reaches the board.
    Here the ssh client is stopped (SIGSTOP): its kernel keeps the TCP connection up but
    nothing answers sshd's keepalives. Before alma-access's ClientAliveInterval drop-in
    the connection, and the session stuck in its rc file, stayed as long as the client did."""
    with virtual_lab(1, image_sshd=True) as (_, [board]):
        sh(board, "usermod", "--shell", "/bin/bash", lab.ADMIN)
        _as_admin(board, ".bashrc", HANG)
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        client = subprocess.Popen(board.ssh_argv(["-o", "BatchMode=yes", "sudo -n alma-health --json"]), **quiet)
        try:
            wait_for("the session stuck in the rc file", lambda: _reached(board) >= 1)
            client.send_signal(signal.SIGSTOP)
            # 4 unanswered keepalives 15 s apart, then the unit's 5 s: well inside 4 minutes
            _wait_gone(board, "no process or unit of the silent client's session left", timeout=4 * 60)
        finally:
            client.kill()
            client.wait()
