"""Hardware in the loop: flash the build's bundle onto a real board through labgrid, boot it,
ssh in with its pinned host key and check what ALMA-OS promises (docs/labgrid.md#hil-suite).

    .venv/bin/python -m pytest tests/hil --lg-env docs/labgrid/station.env.yaml

Without ``--lg-env`` every test here is skipped by labgrid's pytest plugin (its ``target``
fixture: "missing environment config (use --lg-env)")."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def board(target: Any) -> Any:
    """The target's AlmaStrategy (not labgrid's ``strategy`` fixture: labgrid 26's setup hook
    dereferences the env for any test naming it, and fails instead of skipping without one)."""
    return target.get_strategy()


@pytest.fixture(scope="module")
def shell(target: Any, board: Any) -> Any:
    """off → recovery → flashed (the env's images: bundle) → booted → shell, once per run."""
    board.transition("shell")
    assert board.record is not None and board.record.result == "SUCCESS"
    return target.get_driver("AlmaSSHDriver")


def _run(shell: Any, cmd: str) -> tuple[list[str], int]:
    out, _, code = shell.run(cmd)
    return out, code


def test_flashed_and_booted_on_record(board: Any, shell: Any) -> None:
    rec = board.record
    assert rec.final_status == "SUCCESS" and rec.boot is not None and rec.boot.seen
    assert rec.boot.board and rec.boot.board["hostkey"].startswith("SHA256:")


def test_alma_health_ok(shell: Any) -> None:
    out, code = _run(shell, "alma-health")
    assert code == 0, out
    assert out and out[0].startswith("OK"), out


def test_guard_running(shell: Any) -> None:
    out, code = _run(shell, "systemctl is-active alma-guard.service")
    assert (code, out) == (0, ["active"])


def test_watchdog_armed(shell: Any) -> None:
    out, code = _run(shell, "systemctl show -p RuntimeWatchdogUSec --value")
    assert code == 0 and out and out[0] not in ("0", "infinity", ""), out
    _, code = _run(shell, "test -c /dev/watchdog0")
    assert code == 0, "no /dev/watchdog0: the Tegra watchdog's DT node is disabled on this board"


def test_eran_grid_off_by_default(shell: Any) -> None:
    out, _ = _run(shell, "systemctl is-enabled eran-grid.service")
    assert out == ["disabled"], out
    out, _ = _run(shell, "systemctl is-active eran-grid.service")
    assert out == ["inactive"], out


def test_eran_grid_sensor_set_empty(shell: Any) -> None:
    out, code = _run(shell, "python3 -c 'from erangrid import privacy; privacy.assert_empty_sensor_set(); "
                            "print(len(privacy.SENSORS))'")  # fmt: skip
    assert (code, out) == (0, ["0"])
