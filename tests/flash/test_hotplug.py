"""Hotplug through umockdev's testbed (PyGObject) under umockdev-wrapper: `alma boards --wait`
wakes on the udev add event of a recovery-mode board, ignores other devices, and times out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import require_part, require_tool

DRIVER = Path(__file__).resolve().parent / "hotplug_driver.py"


def _scenario(name: str, **env: str) -> dict[str, object]:
    wrapper = require_tool("umockdev-wrapper")
    try:
        import gi

        gi.require_version("UMockdev", "1.0")
    except (ImportError, ValueError):  # skip locally with the install command; CI (.ci/run installs it) fails
        require_part("UMockdev typelib", False)
    r = subprocess.run(
        [wrapper, sys.executable, str(DRIVER), name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_add_event_wakes_the_wait_and_a_gadget_does_not() -> None:
    out = _scenario("add-wakes-wait")
    (board,) = out["found"]  # type: ignore[misc]
    assert board["product"] == "7523" and board["state"] == "recovery"
    # the flashpkg gadget appeared 0.3 s in and did not end the wait; the board did, at once
    assert out["waited_s"] >= 0.55  # type: ignore[operator]
    assert out["latency_s"] < 1.0  # type: ignore[operator]


def test_wait_times_out_with_nothing_found() -> None:
    out = _scenario("timeout")
    assert out["found"] == []
    assert 0.45 <= out["waited_s"] < 3  # type: ignore[operator]


def test_removed_board_leaves_the_listing() -> None:
    out = _scenario("remove")
    assert out["before"] == ["1-3"]
    assert out["after"] == []
    assert out["found"] == []


def test_cli_wait_returns_when_the_board_is_plugged_in() -> None:
    out = _scenario("cli-wait")
    assert out["rc"] == 0
    assert out["out"]["recovery"] == 1  # type: ignore[index]
    assert out["out"]["boards"][0]["usb_instance"] == "1-3"  # type: ignore[index]


@pytest.mark.parametrize("unplug", [True, False], ids=["unplugged", "stays"])
def test_board_vanishing_during_the_write_is_named_from_udev(unplug: bool) -> None:
    """make-sdcard only hangs; udev says the board left while it was being written."""
    out = _scenario("flash-vanish", UNPLUG="1" if unplug else "0", WHEN="write")
    assert out["result"] == "TIMEOUT"
    assert out["phases"][-1] == "flash"  # type: ignore[index]
    assert ("vanished from USB 1-3 during the write" in str(out["reason"])) is unplug


def test_gadget_gone_while_waiting_for_storage_is_the_protocol_not_a_vanished_board() -> None:
    """After step 3 the host powers the flashpkg gadget off itself (udisksctl power-off):
    a removal then is no reason to blame the cable."""
    out = _scenario("flash-vanish", UNPLUG="1", WHEN="storage")
    assert out["result"] == "TIMEOUT"
    assert out["phases"][-1] == "storage"  # type: ignore[index]
    reason = str(out["reason"])
    assert "storage device mmcblk0 never appeared" in reason and "vanished" not in reason
