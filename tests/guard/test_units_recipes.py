"""The baked-in parts: units verified and scored by the real systemd-analyze, the
watchdog drop-in, the recipes (real oelint-adv; their do_install run against this tree)
and the image class's check on a rootfs."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import require_tool
from support_board import SITE, build_and_install, recipe_function, run_installed, run_shell_function
from support_guard import GUARD_DIR, REPO, UNITS_DIR

LAYER = REPO / "layers" / "meta-alma"
RECIPES = {
    name: next((LAYER / "recipes-alma" / name).glob(f"{name}_*.bb"))
    for name in ("python3-almaboard", "alma-guard", "alma-health", "alma-watchdog-config", "alma-fabric-network")
}
BBCLASS = LAYER / "classes" / "alma-fabric-check.bbclass"
UNITS = [
    "alma-guard.service",
    "alma-health.service",
    "alma-health.timer",
    "alma-fabric-network.service",
    "alma-work.slice",
]
EXPOSURE_TARGET = {"alma-guard.service": 4.0, "alma-health.service": 4.0, "alma-fabric-network.service": 4.0}


@pytest.fixture
def unit_copies(tmp_path: Path) -> Path:
    """The units with ExecStart pointing at this checkout (verify checks the binary exists)."""
    for unit in UNITS:
        text = (UNITS_DIR / unit).read_text().replace("/usr/bin/", f"{GUARD_DIR}/")
        (tmp_path / unit).write_text(text)
    return tmp_path


def test_systemd_analyze_verify_is_clean(unit_copies: Path) -> None:
    tool = require_tool("systemd-analyze")
    r = subprocess.run(
        [tool, "verify", "--man=no", *UNITS], cwd=unit_copies, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_systemd_analyze_verify_catches_a_broken_unit(unit_copies: Path) -> None:
    tool = require_tool("systemd-analyze")
    unit = unit_copies / "alma-guard.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=10s", "WatchdogSec=ten\nRestrat=always"))
    r = subprocess.run(
        [tool, "verify", "--man=no", "alma-guard.service"], cwd=unit_copies, capture_output=True, text=True
    )
    assert "Unknown key 'Restrat'" in r.stderr and "Failed to parse sec value" in r.stderr


def exposure(tool: str, unit: Path) -> tuple[float, str]:
    r = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(unit)], capture_output=True, text=True, timeout=60
    )
    out = r.stdout + r.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", out)
    assert m, out
    return float(m.group(1)), out


@pytest.mark.parametrize("unit", sorted(EXPOSURE_TARGET))
def test_systemd_analyze_security_exposure(unit_copies: Path, unit: str) -> None:
    tool = require_tool("systemd-analyze")
    level, out = exposure(tool, unit_copies / unit)
    assert level <= EXPOSURE_TARGET[unit], out


def test_security_score_really_depends_on_the_hardening(unit_copies: Path) -> None:
    """The score is not a constant: strip the hardening and it gets worse."""
    tool = require_tool("systemd-analyze")
    unit = unit_copies / "alma-health.service"
    hardened, _ = exposure(tool, unit)
    hardening = ("Protect", "Private", "Restrict", "SystemCall", "Capability", "NoNewPrivileges", "DynamicUser")
    text = "\n".join(line for line in unit.read_text().splitlines() if not line.startswith(hardening))
    unit.write_text(text + "\n")
    weaker, _ = exposure(tool, unit)
    assert weaker >= 7.0 > hardened


def unit_ini(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(UNITS_DIR / name)
    return cp


def test_guard_unit_is_notify_with_watchdog_and_only_cap_kill() -> None:
    s = unit_ini("alma-guard.service")["Service"]
    assert s["Type"] == "notify" and s["WatchdogSec"] == "10s" and s["Restart"] == "always"
    assert s["CapabilityBoundingSet"] == "CAP_KILL"
    assert s["ReadWritePaths"] == "/sys/fs/cgroup"  # the freezer, nothing else of the system
    assert s["ProtectSystem"] == "strict" and s["NoNewPrivileges"] == "yes"


def test_health_timer_is_enabled_at_install() -> None:
    t = unit_ini("alma-health.timer")
    assert t["Install"]["WantedBy"] == "timers.target"
    assert t["Timer"]["OnUnitActiveSec"] == "1min"


def test_watchdog_dropin_values_are_reasoned_and_valid() -> None:
    tool = require_tool("systemd-analyze")
    path = UNITS_DIR / "10-alma-watchdog.conf"
    lines = path.read_text().splitlines()
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(path)
    values = dict(cp["Manager"])
    assert set(values) == {"RuntimeWatchdogSec", "RebootWatchdogSec"}
    for key, val in values.items():
        i = next(n for n, line in enumerate(lines) if line.startswith(f"{key}="))
        assert lines[i - 1].startswith("#"), f"{key} has no reasoning next to it"
        r = subprocess.run([tool, "timespan", val], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    spans = {k: subprocess.run([tool, "timespan", v], capture_output=True, text=True).stdout for k, v in values.items()}
    assert "30s" in spans["RuntimeWatchdogSec"] and "2min" in spans["RebootWatchdogSec"]


def test_oelint_adv_has_zero_findings_on_the_guard_recipes() -> None:
    oelint = shutil.which("oelint-adv", path=str(Path(sys.executable).parent)) or require_tool("oelint-adv")
    files = [str(p) for p in RECIPES.values()] + [str(BBCLASS)]
    r = subprocess.run(
        [oelint, "--release", "scarthgap", "--mode", "all", "--suppress", "oelint.vars.homepageping", *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = [line for line in (r.stdout + r.stderr).splitlines() if re.search(r":\d+:(error|warning|info):", line)]
    assert r.returncode == 0 and findings == [], "\n".join(findings)


def run_do_install(recipe: Path, dest: Path, workdir: Path, masked: str = "") -> None:
    """A recipe's install, the way bitbake would run it: the PEP 517 wheel build + install for
    recipes that inherit python_setuptools_build_meta (and their do_install:append), else
    do_install, with bash."""
    text = recipe.read_text()
    s = GUARD_DIR
    if re.search(r"^inherit .*python_setuptools_build_meta", text, re.M):
        src = REPO / "tools" / re.search(r'^SRC_URI = "file://(\w+)"', text, re.M).group(1)  # type: ignore[union-attr]
        s = build_and_install(src, dest, workdir)
    variables = {"D": str(dest), "S": str(s), "ALMA_MASKED_SERVICES": masked}
    for fn in ("do_install", "do_install:append"):
        if recipe_function(recipe, fn) is not None:
            run_shell_function(recipe, fn, variables)


def test_recipes_install_what_the_units_need(tmp_path: Path) -> None:
    d = tmp_path / "image"
    masked = re.search(r'ALMA_MASKED_SERVICES \?= "([^"]*)"', (LAYER / "conf/distro/alma.conf").read_text())
    for recipe in RECIPES.values():
        run_do_install(recipe, d, tmp_path, masked.group(1) if masked else "fwupd.service")
    units = d / "usr/lib/systemd/system"
    assert sorted(p.name for p in units.iterdir()) == sorted(UNITS)
    assert (d / "usr/lib/systemd/system.conf.d/10-alma-watchdog.conf").is_file()
    for unit in UNITS:  # every ExecStart= binary is installed
        for line in (units / unit).read_text().splitlines():
            if line.startswith("ExecStart="):
                assert (d / line.split("=", 1)[1].split()[0].lstrip("/")).is_file()
    assert (d / SITE / "almaguard/guard.py").is_file()
    assert (d / SITE / "almaboard/nagios.py").is_file()  # the board library's own recipe
    for conf in ("guard.toml", "health.toml", "fabric.toml"):
        assert (d / "etc/alma" / conf).is_file()
    mask_dir = d / "etc/systemd/system"
    if masked and masked.group(1).split():
        for svc in masked.group(1).split():
            assert (mask_dir / svc).is_symlink() and str((mask_dir / svc).readlink()) == "/dev/null"
    # the installed layout runs: console scripts find the packages in site-packages
    for cmd in ("alma-health", "alma-guard", "alma-fabric"):
        r = run_installed(d, cmd, "--version")
        assert r.returncode == 0 and r.stdout.startswith(f"{cmd} 0.1.0"), r.stderr


def test_python_recipes_build_with_pep517_not_path_shims() -> None:
    for name in ("alma-guard", "python3-almaboard"):
        text = RECIPES[name].read_text()
        assert re.search(r"^inherit python_setuptools_build_meta\b", text, re.M), name
        assert "sys.path" not in text and "site-packages" not in text
    lib = re.search(r'^RDEPENDS:\$\{PN\}-lib = "([^"]*)"', RECIPES["alma-guard"].read_text(), re.M | re.S)
    assert lib and "python3-almaboard" in lib.group(1)


def test_recipes_fetch_from_the_single_source() -> None:
    for name, recipe in RECIPES.items():
        text = recipe.read_text()
        src = "board" if name == "python3-almaboard" else "guard"
        assert f'SRC_URI = "file://{src}"' in text and 'FILESPATH:prepend = "${ALMA_TOOLS_DIR}:"' in text
    layer_conf = (LAYER / "conf/layer.conf").read_text()
    assert "ALMA_TOOLS_DIR" in layer_conf
    assert (GUARD_DIR / "LICENSE").is_file() and (REPO / "tools/board/LICENSE").is_file()
    assert not list((LAYER / "recipes-alma").rglob("*.py"))  # no copied code in the layer


class _Fatal(Exception):
    pass


_CLASS_RUNNER = r"""
import json, sys
libdir, body, rootfs, ports = sys.argv[1:5]
sys.path.append(libdir)  # what bitbake's addpylib does with the layer.conf line
out = {"errors": [], "notes": [], "fatal": None}

class Fatal(Exception):
    pass

class BB:
    def fatal(self, msg):
        out["fatal"] = msg
        raise Fatal(msg)
    def error(self, msg):
        out["errors"].append(msg)
    def note(self, msg):
        out["notes"].append(msg)

class D:
    def getVar(self, name):
        return {"IMAGE_ROOTFS": rootfs, "ALMA_FABRIC_PORTS": ports}.get(name)

try:
    exec(compile(body, "alma-fabric-check.bbclass", "exec"), {"d": D(), "bb": BB()})
except Fatal:
    pass
print(json.dumps(out))
"""


class _BB:
    def __init__(self, data: dict[str, object]) -> None:
        self.errors = list(data["errors"])  # type: ignore[call-overload]
        self.notes = list(data["notes"])  # type: ignore[call-overload]


def _addpylib_dir() -> str:
    """The directory conf/layer.conf's ``addpylib DIR almaboard`` line puts on bitbake's path."""
    text = (LAYER / "conf/layer.conf").read_text()
    m = re.search(r"^addpylib\s+(\S+)\s+almaboard\s*$", text, re.MULTILINE)
    assert m, "layer.conf must addpylib the board library"
    return os.path.normpath(m.group(1).replace("${LAYERDIR}", str(LAYER)))


def run_class_check(rootfs: Path, ports: str = "") -> _BB:
    """Execute the class's python function body in a bare interpreter (-I: no site-packages,
    so nothing but the addpylib directory can provide almaboard), with d and bb stood in for."""
    text = BBCLASS.read_text()
    m = re.search(r"^python alma_fabric_check\(\) \{\n(.*?)^\}", text, re.MULTILINE | re.DOTALL)
    assert m
    body = "\n".join(line[4:] if line.startswith("    ") else line for line in m.group(1).splitlines())
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _CLASS_RUNNER, _addpylib_dir(), body, str(rootfs), ports],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data = json.loads(proc.stdout)
    if data["fatal"]:
        raise _Fatal(data["fatal"])
    return _BB(data)


def test_image_class_fails_a_rootfs_that_bridges_a_fabric_port(tmp_path: Path) -> None:
    nd = tmp_path / "usr/lib/systemd/network"
    nd.mkdir(parents=True)
    (nd / "10-uplink.network").write_text("[Match]\nName=eth0\n[Network]\nDHCP=yes\n")
    bb = run_class_check(tmp_path, "enP5*")
    assert bb.notes == ["alma-fabric-check: no fabric port is bridged"]
    (nd / "br.netdev").write_text("[NetDev]\nName=br0\nKind=bridge\n")
    (nd / "20-fabric.network").write_text("[Match]\nName=enP5p1s0\n[Network]\nBridge=br0\n")
    with pytest.raises(_Fatal, match="1 network config"):
        run_class_check(tmp_path, "enP5*")


def test_image_class_is_wired_into_rootfs_postprocess() -> None:
    text = BBCLASS.read_text()
    assert 'ROOTFS_POSTPROCESS_COMMAND += "alma_fabric_check"' in text
    image = LAYER / "recipes-core/images/alma-image.bb"
    if image.exists():
        assert "alma-fabric-check" in image.read_text()


def test_the_work_slice_bounds_memory_and_tasks(unit_copies: Path) -> None:
    """MemoryMax=/MemoryHigh=/TasksMax= on alma-work.slice, read by systemd's own parser
    (systemd-analyze verify flags a malformed value of exactly these keys). That the kernel
    enforces them cannot be shown here: this VM's cgroup v2 has no memory controller."""
    import re

    tool = require_tool("systemd-analyze")
    text = (UNITS_DIR / "alma-work.slice").read_text()
    values = dict(re.findall(r"^(MemoryHigh|MemoryMax|TasksMax)=(\S+)$", text, re.M))
    high, mx = (int(values[k].rstrip("%")) for k in ("MemoryHigh", "MemoryMax"))
    assert values["MemoryMax"].endswith("%") and 0 < high < mx <= 50  # of the one CPU+GPU pool
    assert 64 <= int(values["TasksMax"]) <= 4096
    broken = unit_copies / "alma-work.slice"
    broken.write_text(text.replace("MemoryMax=25%", "MemoryMax=a-quarter").replace("TasksMax=512", "TasksMax=many"))
    r = subprocess.run([tool, "verify", "--man=no", "alma-work.slice"], cwd=unit_copies, capture_output=True, text=True)
    assert "Invalid memory limit 'a-quarter'" in r.stderr and "Invalid maximum tasks value 'many'" in r.stderr
