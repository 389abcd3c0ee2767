"""`alma lint` says what it is doing before the slow parts (it printed
nothing for ~20 s while oelint-adv ran, and looked hung). The real CLI in its own process, its
stderr read line by line as it arrives: the first progress line must come within 1 s of the
interpreter's own start-up (measured in the same test: `alma --version`), and the line naming
oelint-adv before oelint-adv's first file is read. stdout stays findings only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def _lines_with_times(argv: list[str], env: dict[str, str]) -> tuple[list[tuple[float, str]], str, int]:
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stderr is not None and proc.stdout is not None
    lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stderr]
    out = proc.stdout.read()
    return lines, out, proc.wait(timeout=600)


def test_lint_shows_progress_within_a_second_of_start_up_and_before_oelint(checkout: Path) -> None:
    env = dict(os.environ, ALMA_ROOT=str(checkout), PYTHONUNBUFFERED="1")

    def start_up() -> float:
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "alma", "--version"], env=env, capture_output=True, check=True)
        return time.monotonic() - t0

    before = start_up()
    lines, out, code = _lines_with_times([sys.executable, "-m", "alma", "lint"], env)
    start = max(before, start_up())  # measured either side of the run: the host's load moves
    assert code == 0, (lines, out)
    progress = [(t, line) for t, line in lines if line.startswith("alma lint: ")]
    assert progress, lines
    first_t, first = progress[0]
    assert first_t < start + 1.0, f"first progress line after {first_t:.2f} s (start-up {start:.2f} s)"
    steps = [line for _, line in progress]
    assert any("kas files" in s for s in steps), steps
    assert any("running oelint-adv on layers/" in s for s in steps), steps
    assert all(line.endswith(" ...") for line in steps), steps
    assert not any(line.endswith(" ...") for line in out.splitlines()), out  # stdout: the report only


def test_progress_is_told_each_step_before_it_starts(checkout: Path, monkeypatch) -> None:
    """In-process: the oelint-adv step is announced before oelint-adv is called."""
    from alma.lint import oelint as oel
    from alma.lint import run

    events: list[str] = []
    real = oel.check_layer
    monkeypatch.setattr(oel, "check_layer", lambda layer: events.append("oelint called") or real(layer))
    run.lint(checkout, progress=lambda step: events.append(step))
    assert events[0].startswith("loading kas"), events
    called = events.index("oelint called")
    assert "running oelint-adv" in events[called - 1], events
