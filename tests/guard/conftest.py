"""Fixtures for tools/guard tests: a fake board tree and real child processes to pause."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support_guard import FakeBoard


@pytest.fixture
def board(tmp_path: Path) -> FakeBoard:
    return FakeBoard(tmp_path / "board")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Real processes standing in for the work; always continued and reaped at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(timeout=5)
