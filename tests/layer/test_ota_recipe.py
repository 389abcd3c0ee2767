"""alma-ota's recipe as bitbake would install it: NVIDIA's boot-time verifier masked (the
agent owns "mark good"), the board's settle unit and timer and its identity unit installed and verified by the real
systemd-analyze, oelint-adv clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from support import require_tool
from support_board import run_shell_function

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "layers/meta-alma/recipes-alma/alma-ota/alma-ota_0.1.0.bb"
UNITS = ("alma-identity.service", "alma-ota-settle.service", "alma-ota-settle.timer")


def _install(dest: Path) -> None:
    variables = {"D": str(dest), "S": str(REPO / "tools/ota"), "MACHINE": "jetson-agx-orin-devkit",
                 "ALMA_OTA_CERT": "", "ALMA_OTA_SWUPDATE_CFG": "", "ALMA_OTA_STATE_DIR": "/data/alma-ota",
                 "ALMA_OTA_LOWEST_BOOTLOADER": "36.4.0"}  # fmt: skip
    run_shell_function(RECIPE, "do_install:append", variables)


def test_nv_update_verifier_is_masked_and_the_settle_units_are_installed(tmp_path: Path) -> None:
    """tegra-redundant-boot enables nv_update_verifier.service ("nvbootctrl verify" every boot):
    it would mark a new slot good before the health gate judged it."""
    d = tmp_path / "image"
    _install(d)
    mask = d / "etc/systemd/system/nv_update_verifier.service"
    assert mask.is_symlink() and str(mask.readlink()) == "/dev/null"
    assert sorted(p.name for p in (d / "usr/lib/systemd/system").iterdir()) == sorted(UNITS)
    text = RECIPE.read_text()
    assert re.search(
        r'^SYSTEMD_SERVICE:\$\{PN\} = "alma-ota-settle.service alma-ota-settle.timer alma-identity.service"', text, re.M
    )
    # sshd reads the board's identity from /data (alma-identity.service keeps it there)
    dropin = d / "etc/ssh/sshd_config.d/00-alma-identity.conf"
    assert dropin.read_bytes() == (REPO / "tools/ota/ssh/00-alma-identity.conf").read_bytes()


def test_systemd_analyze_verifies_the_settle_units(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    for unit in UNITS:  # ExecStart= pointing at this checkout (verify checks the binary exists)
        text = (REPO / "tools/ota/systemd" / unit).read_text()
        text = text.replace("/usr/bin/alma-identity", sys.executable)  # a console script, not in a checkout
        (tmp_path / unit).write_text(text.replace("/usr/bin/alma-ota", str(REPO / "tools/ota/alma-ota")))
    r = subprocess.run([tool, "verify", "--man=no", *UNITS], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr


def test_oelint_adv_has_zero_findings_on_the_ota_recipe() -> None:
    oelint = shutil.which("oelint-adv", path=str(Path(sys.executable).parent)) or require_tool("oelint-adv")
    r = subprocess.run([oelint, "--release", "scarthgap", "--mode", "all", "--suppress", "oelint.vars.homepageping",
                        str(RECIPE)], capture_output=True, text=True, timeout=120)  # fmt: skip
    findings = [line for line in (r.stdout + r.stderr).splitlines() if re.search(r":\d+:(error|warning|info):", line)]
    assert r.returncode == 0 and findings == [], "\n".join(findings)
