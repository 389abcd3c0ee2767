"""Fixtures for the fleet tests: a real sshd on loopback (see tests/support_fleet.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

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


@pytest.fixture
def now_per_test(request: pytest.FixtureRequest) -> None:
    """The module's NOW taken when each test starts, not at import: a full suite reaches a test
    many minutes after collection, and a page rendered with an import-time NOW is judged by the
    browser's (or the served page's) own clock, which would call it stale. Opt-in (usefixtures):
    modules that bake NOW into default arguments must keep the one value."""
    request.module.NOW = datetime.now(UTC).replace(microsecond=0)
