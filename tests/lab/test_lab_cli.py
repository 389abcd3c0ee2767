"""`alma lab` without root: a clear error with the next step, before anything is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import run_cli


@pytest.mark.parametrize("verb", [["up", "--boards", "1"], ["down"], ["heat", "vb1", "tj", "90"], ["status"]])
def test_not_root_is_a_usage_error_that_says_what_to_run(
    verb: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("alma.lab.board.os.geteuid", lambda: 1000)
    lab_dir = tmp_path / "lab"
    code, out, err = run_cli(capsys, "lab", *verb, "--dir", lab_dir)
    assert code == 2
    assert "needs root" in err and "sudo alma lab" in err
    assert "Traceback" not in err
    assert not lab_dir.exists()


@pytest.mark.parametrize(
    "verb", [["up", "--cpus", "nan"], ["up", "--cpus", "inf"], ["heat", "vb1", "tj", "nan"]], ids=str
)
def test_a_non_finite_number_is_refused_before_anything_is_touched(
    verb: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """click's FloatRange lets nan through (every comparison with nan is false)."""
    lab_dir = tmp_path / "lab"
    code, _, err = run_cli(capsys, "lab", *verb, "--dir", lab_dir)
    assert code == 2
    assert "finite" in err or "range" in err
    assert not lab_dir.exists()


def test_more_cpus_per_board_than_the_host_has_is_refused_before_anything_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("alma.lab.board.os.geteuid", lambda: 0)
    monkeypatch.setattr("alma.cli.lab.os.cpu_count", lambda: 2)
    lab_dir = tmp_path / "lab"
    code, _, err = run_cli(capsys, "lab", "up", "--boards", "4", "--cpus", "3", "--dir", lab_dir)
    assert code == 2
    assert "this host has 2 cores" in err and "--cpus 0.5" in err
    assert not lab_dir.exists()
