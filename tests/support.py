"""Helpers shared by tests (importable as ``support``: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str) -> str:
    """Path of a real tool the test needs. Skips locally when missing; fails in CI,
    where .ci/run must have installed it (a skipped real-part test would hide that)."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed: .ci/run must install it")
        pytest.skip(f"{name} not installed")
    return path
