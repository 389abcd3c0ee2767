"""The recipe, unit and default config as the image gets them: oelint-adv clean, unit verified
and hardened by systemd-analyze, shipped disabled and opted out, single-sourced from
tools/idlegrid, and the installed tree refuses to run until opted in."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from support import require_tool

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools/idlegrid"
RECIPE_DIR = REPO / "layers/meta-alma/recipes-alma/eran-grid"
RECIPE = next(RECIPE_DIR.glob("eran-grid_*.bb"))
UNIT = TOOLS / "systemd/eran-grid.service"


def test_oelint_adv_has_zero_findings():
    oelint = Path(sys.executable).with_name("oelint-adv")
    proc = subprocess.run(
        [str(oelint), "--release", "scarthgap", "--mode", "all", "--suppress", "oelint.vars.homepageping", str(RECIPE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = [
        line for line in (proc.stdout + proc.stderr).splitlines() if re.search(r":\d+:(error|warning|info):", line)
    ]
    assert findings == [] and proc.returncode == 0


def test_recipe_ships_the_unit_disabled_and_nothing_can_start_it():
    text = RECIPE.read_text()
    assert re.search(r'^SYSTEMD_AUTO_ENABLE:\$\{PN\} = "disable"$', text, re.M)
    assert re.search(r'^SYSTEMD_SERVICE:\$\{PN\} = "eran-grid.service"$', text, re.M)
    units = [p.name for p in (TOOLS / "systemd").iterdir()]
    assert units == ["eran-grid.service"]  # no .timer, .socket, .path or preset beside it
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\.(timer|socket|path)\b|preset", code)
    unit = UNIT.read_text()
    assert "WantedBy=multi-user.target" in unit  # only `systemctl enable` would hook it in


def test_default_config_opts_out():
    cfg = tomllib.loads((TOOLS / "conf/eran-grid.toml").read_text())
    assert cfg["enabled"] is False
    sys.path.insert(0, str(TOOLS))
    from erangrid.config import from_mapping

    assert from_mapping(cfg).enabled is False


def test_single_sourced_no_copy_in_the_layer():
    assert [p.name for p in RECIPE_DIR.rglob("*") if p.is_file()] == [RECIPE.name]
    layer_conf = (REPO / "layers/meta-alma/conf/layer.conf").read_text()
    m = re.search(r"^ALMA_TOOLS_DIR := .*\$\{LAYERDIR\}.*tools", layer_conf, re.M)
    assert m, "layer.conf must set ALMA_TOOLS_DIR from LAYERDIR"
    tools_dir = os.path.normpath(REPO / "layers/meta-alma" / ".." / ".." / "tools")
    text = RECIPE.read_text()
    assert 'FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"' in text and 'SRC_URI = "file://idlegrid"' in text
    assert Path(tools_dir, "idlegrid") == TOOLS


def _install(dest: Path) -> None:
    """Replay the recipe's do_install with oe-core's paths (each line is install(1) argv)."""
    text = RECIPE.read_text()
    body = re.search(r"^do_install\(\) \{\n(.*?)^\}", text, re.S | re.M)
    assert body
    paths = {
        "S": str(TOOLS),
        "D": str(dest),
        "bindir": "/usr/bin",
        "datadir": "/usr/share",
        "sysconfdir": "/etc",
        "nonarch_libdir": "/usr/lib",
        "systemd_system_unitdir": "/usr/lib/systemd/system",
    }
    for line in body.group(1).splitlines():
        line = re.sub(r"\$\{(\w+)\}", lambda m: paths[m.group(1)], line.strip())
        argv = shlex.split(line)
        assert argv[0] == "install"
        expanded: list[str] = []
        for arg in argv:
            expanded += sorted(str(p) for p in Path("/").glob(arg.lstrip("/"))) if "*" in arg else [arg]
        subprocess.run(expanded, check=True)


def test_installed_tree_runs_and_refuses_until_opted_in(tmp_path):
    dest = tmp_path / "image"
    _install(dest)
    shipped = {p.name for p in (dest / "usr/lib/eran-grid/erangrid").iterdir()}
    assert shipped == {p.name for p in (TOOLS / "erangrid").glob("*.py")}
    assert os.access(dest / "usr/bin/eran-grid", os.X_OK)
    assert (dest / "usr/lib/systemd/system/eran-grid.service").read_bytes() == UNIT.read_bytes()
    proc = subprocess.run(
        [
            sys.executable,
            str(dest / "usr/bin/eran-grid"),
            "--config",
            str(dest / "etc/eran-grid/eran-grid.toml"),
            "run",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "disabled: opt-in required" in proc.stderr and "enabled = true" in proc.stderr
    status = subprocess.run(
        [
            sys.executable,
            str(dest / "usr/bin/eran-grid"),
            "--config",
            str(dest / "etc/eran-grid/eran-grid.toml"),
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.stdout.strip() == "disabled: opt-in required" and status.returncode == 1


def test_systemd_analyze_verifies_the_unit(tmp_path):
    analyze = require_tool("systemd-analyze")
    unit = tmp_path / "eran-grid.service"
    # ExecStart must exist for verify: point it at the checkout's entry point.
    unit.write_text(UNIT.read_text().replace("ExecStart=/usr/bin/eran-grid", f"ExecStart={TOOLS / 'eran-grid'}"))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_systemd_analyze_security_rates_the_unit_ok(tmp_path):
    analyze = require_tool("systemd-analyze")
    proc = subprocess.run(
        [analyze, "security", "--offline=true", str(UNIT)], capture_output=True, text=True, timeout=60
    )
    m = re.search(r"Overall exposure level for eran-grid.service: ([\d.]+) (\w+)", proc.stdout)
    assert m, proc.stdout[-500:] + proc.stderr
    assert float(m.group(1)) <= 2.0 and m.group(2) == "OK"


def test_entry_point_runs_from_the_checkout():
    proc = subprocess.run(
        [shutil.which("python3") or sys.executable, str(TOOLS / "eran-grid"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("eran-grid ")
