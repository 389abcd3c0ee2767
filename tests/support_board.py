"""Build and install an on-board package the way its recipe does (oe-core python_pep517):
``pyproject-build --no-isolation --wheel`` on a copy of the source (bitbake unpacks into
WORKDIR; setuptools writes build/ and egg-info beside the sources), then ``python -m
installer --destdir D`` and the recipe's ``do_install:append`` replayed with bash."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
SITE = f"usr/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"

OE_VARS = {
    "bindir": "/usr/bin",
    "datadir": "/usr/share",
    "sysconfdir": "/etc",
    "nonarch_libdir": "/usr/lib",
    "systemd_unitdir": "/usr/lib/systemd",
    "systemd_system_unitdir": "/usr/lib/systemd/system",
    "PYTHON_SITEPACKAGES_DIR": "/" + SITE,
}


def unpack(src: Path, workdir: Path) -> Path:
    """``SRC_URI = "file://<dir>"`` into WORKDIR: a copy without caches or venvs."""
    dest = workdir / src.name
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".venv"))
    return dest


def build_and_install(src: Path, dest: Path, workdir: Path) -> Path:
    """The recipe's do_compile + do_install (python_pep517 part); returns the unpacked S."""
    s = unpack(src, workdir)
    wheels = workdir / f"dist-{src.name}"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(wheels), str(s)],
        check=True,
        capture_output=True,
        cwd=workdir,
        timeout=300,
    )
    [wheel] = wheels.glob("*.whl")
    subprocess.run(
        [sys.executable, "-m", "installer", "--compile-bytecode=0", "--prefix=/usr", f"--destdir={dest}", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return s


def recipe_function(recipe: Path, name: str) -> str | None:
    text = recipe.read_text()
    m = re.search(rf"^{re.escape(name)}\(\) \{{\n(.*?)^\}}", text, re.MULTILINE | re.DOTALL)
    return m.group(1) if m else None


def run_shell_function(recipe: Path, name: str, variables: dict[str, str]) -> None:
    """Run ``do_install`` or ``do_install:append`` of ``recipe`` with bash and these variables."""
    body = recipe_function(recipe, name)
    assert body is not None, f"{recipe.name} has no {name}"
    for key, val in {**OE_VARS, **variables}.items():
        body = body.replace("${" + key + "}", val)
    assert "${" not in body.replace("$unit", ""), f"unexpanded variable in {recipe.name}: {body}"
    subprocess.run(["bash", "-euc", body], check=True)


def run_installed(dest: Path, command: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run an installed console script with only the image's site-packages (``-S``: not the venv's)."""
    return subprocess.run(
        [sys.executable, "-S", str(dest / "usr/bin" / command), *args],
        env={"PYTHONPATH": str(dest / SITE), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
