"""Fixtures for the fleet tests: a real sshd on loopback (see tests/support_fleet.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import require_tool
from support_fleet import Sshd, start_sshd, stop_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    for tool in ("sshd", "ssh", "ssh-keygen"):
        require_tool(tool)
    s = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield s
    finally:
        stop_sshd(s)
