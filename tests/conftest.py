"""Test isolation for the whole suite (see docs/architecture.md, "Conventions").

Every test gets a temp HOME, no ALMA_*/KAS_* variables from the developer's shell, and a
dead proxy so nothing reaches the network by accident.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# No example database: it would be written into the checkout (.hypothesis/) by every run.
settings.register_profile("alma", database=None)
settings.load_profile("alma")

REPO = Path(__file__).resolve().parent.parent
BOARD_TIER = REPO / "tests" / "lab"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The board tier's files share their virtual boards (module fixtures): one xdist group per
    # file keeps a file's tests on one worker under `--dist loadgroup`. xdist hands out the
    # biggest groups first, so their long waits on reboots and ssh overlap the rest of the suite.
    for item in items:
        if item.path.is_relative_to(BOARD_TIER):
            item.add_marker(pytest.mark.xdist_group(f"board-tier-{item.path.stem}"))


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("ALMA_", "KAS_")):
            monkeypatch.delenv(key, raising=False)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    dead = "http://127.0.0.1:9"  # discard port: connections are refused at once
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, dead)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost,::1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,::1")
    yield


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _sigint_handler_restored() -> Iterator[None]:
    """alma's main() ignores SIGINT once it is exiting on an interrupt (a second Ctrl-C must
    not turn 130 into death by SIGINT); called in-process by a test, that would leak into the
    next test's Ctrl-C."""
    import signal

    yield
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
