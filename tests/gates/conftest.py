from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from artefacts.alma_deployfix import Run, make_project, run_alma


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    root = make_project(tmp_path / "proj")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def alma(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    return lambda *args: run_alma(capsys, *args)
