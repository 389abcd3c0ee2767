"""Fixtures for alma lint: a small checkout with one clean layer; tests add the flaws."""

from __future__ import annotations

from pathlib import Path

import pytest
from support_build import make_project
from support_lint import make_clean_layer


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_project(tmp_path / "alma")
    make_clean_layer(root)
    monkeypatch.setenv("ALMA_ROOT", str(root))
    return root


@pytest.fixture
def alma_cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run the real CLI entry point in-process: (exit code, stdout, stderr)."""
    from alma.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
