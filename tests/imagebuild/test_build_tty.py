"""On a terminal alma build shows rich progress bars (driven through a real pty)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support_build import DRIVER, mark_checked_out


@pytest.mark.slow
def test_progress_bars_on_a_tty(project: Path, fakes: Path) -> None:
    mark_checked_out(project)
    master, slave = os.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40")
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "build"], stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))
    assert proc.returncode == 0, screen
    assert re.search(r"setscene\s+━+\s+20/20", screen), screen
    assert re.search(r"tasks\s+━+\s+60/60", screen), screen
    assert "build succeeded" in screen
