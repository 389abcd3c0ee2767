"""tests/hil runs only against real boards: without ``--lg-env`` every test is skipped, saying why
(labgrid's own plugin would fail in its setup hook when a test asks for ``strategy`` and no env
was given)."""

from __future__ import annotations

import pytest

REASON = "hardware-in-the-loop: needs a labgrid env with a real board (pytest tests/hil --lg-env LAB.yaml)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("lg_env", None):
        return
    for item in items:
        if "tests/hil/" in item.nodeid or item.nodeid.startswith("hil/"):
            item.add_marker(pytest.mark.skip(reason=REASON))
