"""Helpers shared by tests (importable as ``support``: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# How long a test waits for an effect (a process ran, a file appeared) before it fails: a
# generous ceiling that holds on a 2-core host at load 30; the wait returns as soon as it holds.
DEADLINE_S = 120.0


def wait_for(cond: Callable[[], Any], timeout: float = DEADLINE_S, what: str = "condition", poll: float = 0.05) -> Any:
    """``cond()``'s first truthy value, polled until ``timeout``; AssertionError after it."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


# The Debian package of each system part a test drives (README: "System packages").
PACKAGE_OF = {
    "umockdev-run": "umockdev",
    "umockdev-wrapper": "umockdev",
    "UMockdev typelib": "gir1.2-umockdev-1.0",
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nats-server": "nats-server",
    "chromium": "chromium",
    "systemd-analyze": "systemd",
    "zstd": "zstd",
    "pzstd": "zstd",
    "prometheus": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "prometheus-node-exporter": "prometheus-node-exporter",
}


def require_part(name: str, found: bool) -> None:
    """Skip (locally) or fail (in CI, where .ci/run must have installed it) when a system part
    is missing; the skip reason is the command that installs it."""
    if found:
        return
    install = f"sudo apt-get install {PACKAGE_OF.get(name, name)}"
    if IN_CI:
        pytest.fail(f"{name} is not installed: .ci/run must install it ({install})")
    pytest.skip(f"{name} not installed: {install}")


def require_tool(name: str) -> str:
    """Path of a real tool the test needs. Skips locally when missing; fails in CI,
    where .ci/run must have installed it (a skipped real-part test would hide that)."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    require_part(name, path is not None)
    assert path is not None
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """Run the real ``alma`` entry point in-process: (exit code, stdout, stderr).

    Like the console script, ``sys.exit(main())``: the code is main()'s return value (click
    hands back ``ctx.exit`` codes in non-standalone mode) or a SystemExit's code.
    """
    from alma.cli.main import main

    capsys.readouterr()
    try:
        ret = main([str(a) for a in args])
        code = ret if isinstance(ret, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err
