"""Fixtures for alma lint: a small checkout with one clean layer; tests add the flaws."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support import run_cli
from support_build import make_project
from support_lint import make_clean_layer


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_project(tmp_path / "alma")
    make_clean_layer(root)
    monkeypatch.setenv("ALMA_ROOT", str(root))
    return root


@pytest.fixture
def alma_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run the real CLI entry point in-process: (exit code, stdout, stderr)."""
    return lambda *args: run_cli(capsys, *args)
