"""Run an older revision of `alma` beside this one, in the same benchmark run.

``old_src(rev)`` extracts ``src/`` of git revision ``rev`` into a temp dir; ``alma_argv`` is
the command that runs that code with this venv's interpreter and dependencies (PYTHONPATH
wins over the editable install). Nothing is checked out or changed in the working tree.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
# main before the build/verify/gates chain, the loader and the linear marker scan
BASE_REV = "9b07e45"


def old_src(rev: str, into: Path) -> Path | None:
    """``into``/src of revision ``rev``, or None when git or the revision is not there."""
    try:
        tar = subprocess.run(["git", "archive", rev, "src"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"old revision {rev} not available: {exc}", file=sys.stderr)
        return None
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(into, filter="data")
    return into / "src"


def alma_argv() -> list[str]:
    return [str(PYTHON), "-m", "alma"]


def env_for(src: Path | None, env: dict[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": str(src)} if src else {k: v for k, v in env.items() if k != "PYTHONPATH"}
