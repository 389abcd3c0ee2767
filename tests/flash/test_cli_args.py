"""Bad option values are usage errors (exit 2) before anything is touched."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("value", ["flash=nan", "flash=inf", "flash=-5", "flash=0", "flash=soon", "nosuch=10"])
def test_phase_timeout_must_be_a_known_phase_and_positive_seconds(value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "alma", "flash", "--yes", "--phase-timeout", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--phase-timeout" in proc.stderr and "Traceback" not in proc.stderr
