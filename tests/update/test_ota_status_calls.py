"""alma-ota status asks nvbootctrl once per target: the running slot comes from the rootfs
``dump-slots-info`` it reads anyway (L4T R36 prints "Current rootfs slot: A|B" there), so a
status (one per desktop poll) starts the slot tool twice, not three times; a dump without that
line still gets the slot from ``get-current-slot``. The tools are shell stand-ins that log
their arguments and print L4T R36's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support_update import AGENT

DUMP_ROOTFS = """Current rootfs slot: {cur}
Active rootfs slot: B
num_slots: 2
slot: 0,             retry_count: 3,             status: normal
slot: 1,             retry_count: 2,             status: normal
"""
DUMP_BOOTLOADER = """Current version: 36.4.3
Capsule update status: 0
Current bootloader slot: A
Active bootloader slot: A
num_slots: 2
slot: 0,             status: normal
slot: 1,             status: normal
"""


def _board(root: Path, dump_rootfs: str) -> Path:
    (root / "etc/alma").mkdir(parents=True)
    (root / "data/alma-ota").mkdir(parents=True)
    log = root / "calls"
    (root / "dump-rootfs").write_text(dump_rootfs)
    (root / "dump-bootloader").write_text(DUMP_BOOTLOADER)
    tool = root / "nvbootctrl"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in\n'
        f'  "-t rootfs dump-slots-info") cat {root}/dump-rootfs ;;\n'
        f'  "-t bootloader dump-slots-info") cat {root}/dump-bootloader ;;\n'
        '  "-t rootfs get-current-slot") echo 1 ;;\n'
        '  *) echo "nvbootctrl: unknown command" >&2; exit 1 ;;\n'
        "esac\n"
    )
    systemctl = root / "systemctl"
    systemctl.write_text("#!/bin/sh\necho active\n")
    for t in (tool, systemctl):
        os.chmod(t, 0o755)
    cfg = {"state_dir": "/data/alma-ota", "machine": "test", "nvbootctrl": str(tool), "systemctl": str(systemctl)}
    (root / "etc/alma/ota.json").write_text(json.dumps(cfg))
    return log


def _status(root: Path) -> dict[str, object]:
    p = subprocess.run([sys.executable, str(AGENT), "--root", str(root), "status"], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    got: dict[str, object] = json.loads(p.stdout)
    return got


def test_status_reads_the_running_slot_from_the_rootfs_dump(tmp_path: Path) -> None:
    log = _board(tmp_path, DUMP_ROOTFS.format(cur="B"))
    st = _status(tmp_path)
    assert st["current_slot"] == "b"
    assert st["slots"] == {"active": "b", "a": {"retry_count": 3, "status": "normal"},
                           "b": {"retry_count": 2, "status": "normal"}, "bootloader_version": "36.4.3",
                           "capsule_status": 0}  # fmt: skip
    assert log.read_text().splitlines() == ["-t rootfs dump-slots-info", "-t bootloader dump-slots-info"]


def test_a_dump_without_the_current_slot_asks_get_current_slot(tmp_path: Path) -> None:
    log = _board(tmp_path, DUMP_ROOTFS.format(cur="B").split("\n", 1)[1])
    assert _status(tmp_path)["current_slot"] == "b"
    assert "-t rootfs get-current-slot" in log.read_text().splitlines()
