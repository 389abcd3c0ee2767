"""Fixtures for alma build: a small ALMA-OS checkout, fake kas/bitbake on PATH, injected probes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support import run_cli
from support_build import GOOD, install_default_admin_key, install_fakes, make_project

from alma.imagebuild import preflight as pf


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_project(tmp_path / "alma")
    monkeypatch.setenv("ALMA_ROOT", str(root))
    return root


@pytest.fixture(autouse=True)
def admin_key() -> Path:
    """The test HOME's default public key: a release build needs an admin key."""
    return install_default_admin_key(Path.home())


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake kas + bitbake first on PATH; returns the record file (one JSON object a line)."""
    bin_dir = tmp_path / "fakebin"
    install_fakes(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SHELL", "/bin/sh")
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    return record


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Callable[..., pf.Probes]:
    """Install probes of a healthy build host; keyword arguments replace single probes."""

    def install(**over: object) -> pf.Probes:
        kw = {**GOOD, "find_kas": pf._find_kas, **over}
        p = pf.Probes(**kw)  # type: ignore[arg-type]
        monkeypatch.setattr(pf, "default_probes", lambda: p)
        return p

    install()
    return install


@pytest.fixture
def alma(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run the real CLI entry point in-process: (exit code, stdout, stderr)."""
    return lambda *args: run_cli(capsys, *args)
