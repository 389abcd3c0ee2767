"""AlmaFlashDriver with a local AlmaRecoveryBoard (labgrid without a coordinator): the board is
matched as `alma boards` matches it, the flash is FlashSession's, failures raise with the
record's reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import require_tool
from support_flash import DEVICES, Station

HERE = Path(__file__).resolve().parent


def test_local_flash_returns_the_record_and_raises_with_its_reason(station: Station) -> None:
    good = station.bundle("good")
    station.manifest(good)
    bad_tree = station.bundle("bad", outcomes={"*": "final-failed"}, machine="jetson-orin-nano-devkit-nvme")
    station.manifest(bad_tree, machine="jetson-orin-nano-devkit-nvme")
    r = subprocess.run(
        [require_tool("umockdev-run"), "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--",
         sys.executable, str(HERE / "local_flash.py"), str(good), str(bad_tree)],
        capture_output=True, text=True, timeout=120, env=station.env(), cwd=station.base, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["avail"] is True and out["module"].startswith("Jetson Orin Nano 8GB")
    assert out["good"]["result"] == "SUCCESS" and out["good"]["board"]["usb_instance"] == "1-3"
    bad = out["bad"]
    assert bad["record"]["result"] == "FAILED" and bad["record"]["final_status"] == "FAILED"
    assert "FAILED" in bad["message"] and bad["record"]["reason"] in bad["message"]
    assert str(station.records) in bad["hint"]
    assert len(station.records_list()) == 2
