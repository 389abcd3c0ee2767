"""The OTA agent's ota.json is read through almaboard.fields: a value of the wrong type or
grammar is refused (exit 2, naming the file) before any tool runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support_update import AGENT

GOOD = {
    "machine": "jetson-orin-nano-devkit",
    "hw_revision": "1.0",
    "cert": "/etc/alma/ota-cert.pem",
    "state_dir": "/data/alma-ota",
    "lowest_bootloader": "36.4.0",
}


def _status(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AGENT), "--root", str(root), "status"], capture_output=True, text=True, timeout=60
    )


# Each was taken as it came before: a list machine went into swupdate's argv as "['x']", a
# numeric state dir became a directory named "5", a typo'd key was silently ignored.
@pytest.mark.parametrize(
    ("key", "bad", "needle"),
    [
        ("machine", ["jetson"], "machine: must be a string"),
        ("machine", "../../x", "machine: '../../x' is not a MACHINE name"),
        ("state_dir", 5, "state_dir: must be a string"),
        ("lowest_bootloader", "36.4; reboot", "lowest_bootloader:"),
        ("swupdte", "swupdate", "unknown key(s) in the top level: swupdte"),
    ],
)
def test_a_bad_ota_json_is_refused_naming_the_file(tmp_path: Path, key: str, bad: object, needle: str) -> None:
    conf = tmp_path / "etc/alma/ota.json"
    conf.parent.mkdir(parents=True)
    conf.write_text(json.dumps({**GOOD, key: bad}))
    r = _status(tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{conf}: {needle}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "5").exists()  # nothing created
