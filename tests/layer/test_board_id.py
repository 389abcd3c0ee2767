"""The board's console identity line: the oneshot unit checked and scored by the
real systemd-analyze, its script run under dash and bash against a real host key, and the
line rendered by the real agetty exactly as alma flash then parses it."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest
from support import DEADLINE_S, require_tool
from support_guard import REPO

from alma.flash.identity import parse_board_line

FILES = REPO / "layers/meta-alma/recipes-alma/alma-board-id/files"
SCRIPT = FILES / "alma-board-issue"
UNIT = FILES / "alma-board-issue.service"
RECIPE = FILES.parent / "alma-board-id_0.1.0.bb"
EXPOSURE_TARGET = 2.0


@pytest.fixture
def unit_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout (verify checks the binary exists)."""
    text = UNIT.read_text().replace("/usr/libexec/alma-board-id/alma-board-issue", str(SCRIPT))
    (tmp_path / UNIT.name).write_text(text)
    return tmp_path / UNIT.name


def test_systemd_analyze_verify_is_clean(unit_copy):
    tool = require_tool("systemd-analyze")
    r = subprocess.run([tool, "verify", "--man=no", unit_copy.name], cwd=unit_copy.parent, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_systemd_analyze_security_exposure(unit_copy):
    tool = require_tool("systemd-analyze")
    r = subprocess.run([tool, "security", "--offline=true", "--no-pager", str(unit_copy)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= EXPOSURE_TARGET, r.stdout


def test_unit_runs_after_host_keys_and_before_the_gettys():
    text = UNIT.read_text()
    assert "After=sshdgenkeys.service" in text and "Wants=sshdgenkeys.service getty-pre.target" in text
    assert "Before=getty-pre.target" in text and "RuntimeDirectory=alma-board" in text
    recipe = RECIPE.read_text()
    assert "ln -sf /run/alma-board/issue ${D}${sysconfdir}/issue.d/50-alma-board.issue" in recipe


def host_key(tmp_path: Path) -> tuple[Path, str]:
    require_tool("ssh-keygen")
    key = tmp_path / "keys" / "ssh_host_ed25519_key"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    fpr = subprocess.run(["ssh-keygen", "-l", "-f", f"{key}.pub"], capture_output=True, text=True, check=True)
    return key.parent, fpr.stdout.split()[1]


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_script_writes_the_issue_line_with_the_real_fingerprint(tmp_path, shell):
    sh = require_tool(shell)
    keydir, fpr = host_key(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    env = {"PATH": "/usr/bin:/bin", "ALMA_BOARD_RUNTIME_DIR": str(run), "ALMA_SSH_KEYDIR": str(keydir)}
    r = subprocess.run([sh, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (run / "issue").read_text() == f"alma-board: name=\\n addr=\\4,\\6 hostkey={fpr}\n"
    assert sorted(p.name for p in run.iterdir()) == ["issue"]  # the temp file was renamed


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_script_fails_without_a_host_key(tmp_path, shell):
    sh = require_tool(shell)
    (tmp_path / "keys").mkdir()
    env = {"PATH": "/usr/bin:/bin", "ALMA_BOARD_RUNTIME_DIR": str(tmp_path), "ALMA_SSH_KEYDIR": str(tmp_path / "keys")}
    r = subprocess.run([sh, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no ed25519 host key fingerprint" in r.stderr
    assert not (tmp_path / "issue").exists()


def agetty_show(issue: Path) -> str:
    """What agetty prints for an issue file, on a real pty (agetty --show-issue)."""
    agetty = require_tool("agetty")
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([agetty, "--show-issue", "--issue-file", str(issue)], stdin=slave, stdout=slave,
                             stderr=slave)  # fmt: skip
        p.wait(timeout=DEADLINE_S)
        out = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if out:
                    break
                continue
            chunk = os.read(master, 4096)
            if not chunk:
                break
            out += chunk
        return out.decode()
    finally:
        os.close(master)
        os.close(slave)


def test_agetty_renders_the_line_and_alma_flash_parses_it(tmp_path):
    require_tool("dash")
    keydir, fpr = host_key(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    env = {"PATH": "/usr/bin:/bin", "ALMA_BOARD_RUNTIME_DIR": str(run), "ALMA_SSH_KEYDIR": str(keydir)}
    subprocess.run(["dash", str(SCRIPT)], env=env, check=True)
    shown = agetty_show(run / "issue")
    lines = [ln for ln in shown.replace("\r", "").splitlines() if ln.startswith("alma-board:")]
    assert len(lines) == 1, shown
    got = parse_board_line(lines[0])
    assert got is not None, lines[0]
    assert got.name == os.uname().nodename and got.hostkey == fpr
