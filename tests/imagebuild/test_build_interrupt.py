"""Ctrl-C during a build: bitbake gets SIGINT through its process group and stops cleanly; exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import DEADLINE_S
from support_build import DRIVER, mark_checked_out, read_record


@pytest.mark.slow
def test_ctrl_c_stops_bitbake_cleanly_and_exits_130(project: Path, fakes: Path) -> None:
    mark_checked_out(project)
    env = dict(os.environ, FAKE_BITBAKE_SCENARIO="interrupt")
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "build"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    latest = project / "build" / "jetson-orin-nano-devkit" / "alma-build-latest.log"
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if latest.exists() and "NOTE: Running task 23 of 60" in latest.read_text():
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the fake build never reached task 23")
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C delivers to alma
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 130, err
    assert "interrupted; bitbake stopped cleanly" in err
    assert "try: run the same command again" in err
    assert "build interrupted after" in out
    # bitbake itself got SIGINT (via the process group) and was allowed to shut down
    assert {"tool": "bitbake", "signal": "SIGINT"} in read_record(fakes)
    text = latest.read_text()
    assert "# alma: interrupted (Ctrl-C); bitbake was sent SIGINT and stopped" in text
    assert "NOTE: Running task 23 of 60" in text
