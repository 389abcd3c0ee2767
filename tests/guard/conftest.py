"""Fixtures for tools/guard tests: a fake board tree and real child processes to pause."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from support import IN_CI
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


# -- the real cgroup v2 freezer: a child group of this machine's hierarchy --------------


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _no_cgroup(why: str) -> NoReturn:
    # The one permitted skip, on a developer machine; CI's machine (root, cgroup v2) must run it.
    if IN_CI:
        pytest.fail(f"cgroup v2 freeze path not testable in CI: {why}")
    pytest.skip(why)


@pytest.fixture
def child_cgroup() -> Iterator[Path]:
    mount = _cgroup2_mount()
    if mount is None:
        _no_cgroup("no cgroup2 hierarchy mounted on this machine")
    cg = mount / f"alma-guard-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        cg.mkdir()
    except OSError as exc:
        _no_cgroup(f"cannot create a child cgroup under {mount}: {exc.strerror}")
    try:
        if not (cg / "cgroup.freeze").exists():
            _no_cgroup(f"{mount} has no cgroup.freeze (kernel < 5.2)")
        yield cg
    finally:
        procs = cg / "cgroup.procs"
        for pid in procs.read_text().split() if procs.exists() else []:
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.05)
