"""Fixtures for tests/labgrid; the lab itself lives in tests/support_labgrid.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support_flash import Station


@pytest.fixture
def station(tmp_path: Path) -> Station:
    return Station(tmp_path)
