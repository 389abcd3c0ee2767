"""Fixtures for the flashing station's tests; the helpers live in tests/support_flash.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support_flash import Station, make_bundle_tree


@pytest.fixture
def station(tmp_path: Path) -> Station:
    return Station(tmp_path)


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str = "tree", **kw: object) -> Path:
        return make_bundle_tree(tmp_path / name, **kw)  # type: ignore[arg-type]

    return make
