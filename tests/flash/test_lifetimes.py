"""Lifetimes belong to the flasher: a SIGKILLed alma leaves its initrd-flash running, and the
board stays locked, its run dir stays, and it gets a record once the flasher is gone.

The issue's attack: the lock's descriptor was close-on-exec, so after `kill -9` of alma its
initrd-flash (own process group) kept running unlocked; the next `alma flash` of the board
was let in and both wrote the board; the next start deleted the orphan's run dir; the
killed board never got a record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support import require_tool
from support_flash import DEVICES, Station, make_bundle_tree, sha256, tar_gz

from alma.flash import leftovers

# The bundle's initrd-flash: the first run marks itself and waits (ignoring the broken pipe a
# killed alma leaves) until released; any later run flashes at once.
SCRIPT = """#!/bin/bash
trap '' PIPE HUP
if [ -e "$I32_MARK" ]; then
    echo "== Step 1: Signing binaries at x =="
    echo "Final status: SUCCESS"
    exit 0
fi
echo "== Step 1: Signing binaries at x =="
echo "signing" > log.initrd-flash.20261204
echo $$ > "$I32_MARK.tmp" && mv "$I32_MARK.tmp" "$I32_MARK"
while [ ! -e "$I32_RELEASE" ]; do sleep 0.05; done
echo "written after alma was killed" >> log.initrd-flash.20261204
exit 0
"""

# Runs inside one umockdev testbed, so every alma sees (and locks) the same device node.
DRIVER = r"""
import json, os, signal, subprocess, sys, time
bundle, sha, mark, release, out = sys.argv[1:6]
alma = [sys.executable, "-m", "alma", "flash", "--yes", "--console", "none", bundle, "--sha256", sha]

def until(cond, what):
    end = time.monotonic() + 120
    while not cond():
        if time.monotonic() > end:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(0.05)

def gone(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True

first = subprocess.Popen(alma, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
until(lambda: os.path.exists(mark), "the first flasher")
flasher = int(open(mark).read())
os.kill(first.pid, signal.SIGKILL)
first.wait()
alive_after_kill = not gone(flasher)
second = subprocess.run(alma, capture_output=True, text=True, timeout=120)
open(release, "w").close()
until(lambda: gone(flasher), "the orphaned flasher to end")
third = subprocess.run(alma, capture_output=True, text=True, timeout=120)
json.dump({"alive_after_kill": alive_after_kill, "second": [second.returncode, second.stderr],
           "third": [third.returncode, third.stderr]}, open(out, "w"))
"""


def test_a_killed_almas_flasher_keeps_the_board_locked_and_gets_a_record(station: Station, tmp_path: Path) -> None:
    tree = make_bundle_tree(tmp_path / "tree")
    (tree / "initrd-flash").write_text(SCRIPT)
    bundle = tar_gz(tree, tmp_path / "alma-image-jetson-orin-nano-devkit.rootfs-20261130120000.tegraflash.tar.gz")
    mark, release, out = tmp_path / "mark", tmp_path / "release", tmp_path / "out.json"
    umockdev = require_tool("umockdev-run")
    cmd = [umockdev, "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--", sys.executable, "-c", DRIVER]
    env = station.env(I32_MARK=str(mark), I32_RELEASE=str(release))
    args = [str(bundle), sha256(bundle), str(mark), str(release), str(out)]
    r = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert got["alive_after_kill"]  # the flasher outlived alma, as in the issue
    rc2, err2 = got["second"]
    assert rc2 == 2 and "already being flashed" in err2, err2  # the orphan still holds the board's lock
    rc3, err3 = got["third"]
    assert rc3 == 0, err3
    recs = station.records_list()
    assert sorted(x["result"] for x in recs) == ["INTERRUPTED", "REFUSED", "SUCCESS"], err3
    (killed,) = [x for x in recs if x["result"] == "INTERRUPTED"]
    assert "interrupted: alma killed" in str(killed["reason"]) and "flasher ran until 20" in str(killed["reason"])
    assert killed["bundle_sha256"] == sha256(bundle) and killed["board"]["usb_instance"]
    logs = killed["logs"]
    host_log = station.records / str(logs["host_log"])
    assert "written after alma was killed" in host_log.read_text()  # its evidence kept, to the end
    assert not list(station.work.glob("run-*"))  # the orphan's run dir went once the flasher had


def _note(run: Path, pid: int, start: str | None) -> None:
    run.mkdir(mode=0o700)
    (run / leftovers.NOTE).write_text(json.dumps({"pid": pid, "start": start, "boot_id": leftovers._boot_id()}))


def test_a_run_dir_stays_while_its_orphaned_flasher_runs(tmp_path: Path) -> None:
    run = tmp_path / "run-a"
    run.mkdir(mode=0o700)
    code = (
        "import os, sys, time\n"
        "from alma.flash import leftovers\n"
        "fd = leftovers.mark_run(__import__('pathlib').Path(sys.argv[1]))\n"
        "leftovers.mark_flasher(__import__('pathlib').Path(sys.argv[1]), '1-3', {'board_dir': '1-3'})\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.set_inheritable(fd, True); os.setsid()  # as pass_fds does for the real flasher\n"
        "    os.execvp('sleep', ['sleep', '600'])\n"
        "print(pid, flush=True); time.sleep(600)\n"
    )
    alma = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    assert alma.stdout is not None
    flasher = int(alma.stdout.readline())
    try:
        alma.kill()  # SIGKILL: the flasher lives on, orphaned
        alma.wait()
        msgs = leftovers.clean_stale_runs(tmp_path)
        assert run.is_dir() and "still runs" in msgs[0], msgs
    finally:
        os.kill(flasher, signal.SIGKILL)
    end = time.monotonic() + 60
    killed: list[leftovers.KilledFlash] = []
    while run.exists():  # the orphan is reaped by init (or stays a zombie: gone either way)
        assert time.monotonic() < end, "the run dir outlived its flasher"
        time.sleep(0.05)
        leftovers.clean_stale_runs(tmp_path, on_killed=killed.append)
    assert [k.info["board_dir"] for k in killed] == ["1-3"]


def test_a_zombie_alma_counts_as_gone(tmp_path: Path) -> None:
    """alma's process exited but nobody reaped it yet: its dir is stale, not live."""
    run = tmp_path / "run-z"
    run.mkdir(mode=0o700)
    code = "import sys, pathlib\nfrom alma.flash import leftovers\nleftovers.mark_run(pathlib.Path(sys.argv[1]))\n"
    zombie = subprocess.Popen([sys.executable, "-c", code, str(run)])  # exits; not reaped until wait()
    end = time.monotonic() + 60
    while _state(zombie.pid) != "Z":
        assert time.monotonic() < end
        time.sleep(0.01)
    try:
        msgs = leftovers.clean_stale_runs(tmp_path)
        assert not run.exists(), msgs
        assert msgs and "removed" in msgs[0]
    finally:
        zombie.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
