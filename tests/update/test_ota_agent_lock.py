"""alma-ota's run lock on a full disk, and `release` of a run that holds nothing. On a full
state dir `begin` printed `error: : No space left on device` (no path) and left an empty
lock.json; `release` of a run that held nothing answered "released". The disk is a real
tmpfs filled to the last byte (in a private mount namespace), or a write failing with ENOSPC
injected in-process where no mount is allowed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import IN_CI
from support_update import AGENT

REPO = Path(__file__).resolve().parents[2]


def _board(root: Path) -> Path:
    (root / "etc/alma").mkdir(parents=True)
    (root / "etc/alma/ota.json").write_text(json.dumps({"state_dir": "/data/alma-ota", "machine": "test"}))
    state = root / "data/alma-ota"
    state.mkdir(parents=True)
    return state


def _ota(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AGENT), "--root", str(root), *args], capture_output=True, text=True, timeout=60
    )


FULL_DISK = r"""
import json, os, subprocess, sys
state, agent, root = sys.argv[1:4]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", state], check=True)
fd = os.open(os.path.join(state, "fill"), os.O_WRONLY | os.O_CREAT)
try:  # every byte taken
    while os.write(fd, b"x" * 4096):
        pass
except OSError:
    pass
os.close(fd)
def ota(*args):
    p = subprocess.run([sys.executable, agent, "--root", root, *args], capture_output=True, text=True)
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}
out = {"full": ota("begin", "--run", "r1"), "left": sorted(os.listdir(state))}
os.unlink(os.path.join(state, "fill"))
out["freed"] = ota("begin", "--run", "r1")
out["lock"] = open(os.path.join(state, "lock.json")).read()
print(json.dumps(out))
"""


def test_begin_on_a_full_state_dir_names_the_path_and_leaves_no_lock(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        if IN_CI:
            pytest.fail("needs root and unshare (util-linux) to mount a private tmpfs")
        pytest.skip("needs root and unshare (util-linux): apt-get install util-linux, run as root")
    root = tmp_path / "board"
    state = _board(root)
    proc = subprocess.run(
        [
            unshare,
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            FULL_DISK,
            str(state),
            str(AGENT),
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    full = got["full"]
    assert full["rc"] == 4, full
    lock = f"{state}/lock.json"
    assert f"alma-ota: error: cannot write {lock}: No space left on device" in full["err"]
    assert json.loads(full["out"])["error"] == f"cannot write {lock}: No space left on device"
    # no lock.json, empty or partial, and no temporary file (.agent.lock is the agent's own
    # one-step-at-a-time flock file: empty, taken before any step)
    assert [n for n in got["left"] if n != ".agent.lock"] == ["fill"]
    assert got["freed"]["rc"] == 0 and json.loads(got["lock"])["run"] == "r1"


def test_a_failed_lock_write_leaves_nothing_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The same with ENOSPC injected at the sync (how a full disk shows on a buffered write)."""
    sys.path[:0] = [str(REPO / "tools/ota"), str(REPO / "tools/board")]
    from almaota import agent

    root = tmp_path / "board"
    state = _board(root)
    real_fsync = os.fsync

    def full(fd: int) -> None:
        if os.fstat(fd).st_size > 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # no filename, as the kernel's
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    assert agent.main(["--root", str(root), "begin", "--run", "r1"]) == 4
    err = capsys.readouterr().err
    assert f"cannot write {state / 'lock.json'}: No space left on device" in err and "error: : " not in err
    assert [n for n in os.listdir(state) if n != ".agent.lock"] == []  # the flock file is empty, always there
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert agent.main(["--root", str(root), "begin", "--run", "r1"]) == 0  # a later begin takes the board


def test_release_of_nothing_says_nothing_was_held(tmp_path: Path) -> None:
    root = tmp_path / "board"
    state = _board(root)
    assert _ota(root, "begin", "--run", "r1").returncode == 0
    other = _ota(root, "release", "--run", "r2")
    assert other.returncode == 0  # idempotent, documented in docs/ota.md
    assert json.loads(other.stdout) == {
        "released": False,
        "detail": "run r2 held nothing; the board is held by run r1",
    }
    assert json.loads((state / "lock.json").read_text())["run"] == "r1"  # untouched
    mine = _ota(root, "release", "--run", "r1")
    assert mine.returncode == 0 and json.loads(mine.stdout) == {"released": True}
    again = _ota(root, "release", "--run", "r1")
    assert again.returncode == 0 and json.loads(again.stdout) == {"released": False, "detail": "run r1 held nothing"}
