"""`alma lint` says what it is doing before the slow parts (it printed
nothing for ~20 s while oelint-adv ran, and looked hung). The real CLI in its own process, its
stderr read line by line as it arrives, with Python's own import trace in the same stream
(PYTHONPROFILEIMPORTTIME): the first progress line must come before kas or its schema
(jsonschema) is imported (an order in one stream, whatever the host's load), and the line naming
oelint-adv before oelint-adv's first file is read. stdout stays findings only. (A limit of
"1 s after the interpreter's start-up" failed beside 16 busy loops: the order is the property,
the start-up it rides on is bench/bench_startup.py's.)"""

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


def test_lint_shows_progress_before_its_slow_imports_and_before_oelint(checkout: Path) -> None:
    env = dict(os.environ, ALMA_ROOT=str(checkout), PYTHONUNBUFFERED="1", PYTHONPROFILEIMPORTTIME="1")
    lines, out, code = _lines_with_times([sys.executable, "-m", "alma", "lint"], env)
    assert code == 0, (lines, out)
    progress = [(t, line) for t, line in lines if line.startswith("alma lint: ")]
    assert progress, lines
    stream = [line for _, line in lines]
    first = stream.index(progress[0][1])
    imported = [line.rsplit("|", 1)[-1].strip() for line in stream if line.startswith("import time:")]
    assert "kas" in imported and "jsonschema" in imported, imported[-20:]  # the trace sees them
    heavy = [i for i, line in enumerate(stream) if line.startswith("import time:")
             and line.rsplit("|", 1)[-1].strip().split(".")[0] in ("kas", "jsonschema")]  # fmt: skip
    assert first < min(heavy), stream[: min(heavy) + 1][-10:]
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
