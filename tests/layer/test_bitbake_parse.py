"""Real bitbake (2.8, scarthgap) parses alma-image with an admin key set.

Runs the script $ALMA_CHECK_LAYER names (arguments: <checkout> <machine> <extra .conf>): stage 1
of docs/layer.md, "Checked with real bitbake" (bitbake -p and -g alma-image against oe-core,
meta-oe and meta-tegra at their pinned commits, offline, as a non-root `builder` user) with
ALMA_ADMIN_KEYS in local.conf, then asks bitbake itself (bitbake-getvar) what reached the
recipes. Skipped, saying so, where that environment does not exist."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support_build import ADMIN_PUB

pytestmark = pytest.mark.slow
CHECK = Path(os.environ.get("ALMA_CHECK_LAYER", "/work/yocto/check-layer.sh"))
REPO = Path(__file__).resolve().parents[2]
MACHINE = "jetson-orin-nano-devkit"

GETVAR = """\
cd "$1/openembedded-core" && . ./oe-init-build-env "$2" >/dev/null || exit 1
bitbake-getvar --value -q -r alma-access ALMA_ADMIN_KEYS
bitbake-getvar --value -q -r tegra-flash-init SRC_URI
bitbake-getvar --value -q -r packagegroup-alma RDEPENDS:packagegroup-alma
bitbake -m >/dev/null 2>&1
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    if not CHECK.is_file() or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip(
            f"no real bitbake environment here ({CHECK} missing, or not root with runuser): set it up as "
            "docs/layer.md, 'Checked with real bitbake', says and point ALMA_CHECK_LAYER at the script"
        )
    conf = tmp_path_factory.mktemp("conf") / "keys.conf"
    conf.write_text(f'ALMA_ADMIN_KEYS = "{ADMIN_PUB}"\n')
    conf.parent.chmod(0o755)
    conf.chmod(0o644)
    r = subprocess.run([str(CHECK), str(REPO), MACHINE, str(conf)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout + r.stderr
    build = f"/work/yocto/build-{REPO.name}-{MACHINE}"
    g = subprocess.run(
        [
            "runuser",
            "-u",
            "builder",
            "--",
            "env",
            "-i",
            "HOME=/home/builder",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "LANG=en_US.UTF-8",
            "LC_ALL=en_US.UTF-8",
            "BB_SERVER_TIMEOUT=30",
            "bash",
            "-c",
            GETVAR,
            "getvar",
            str(CHECK.parent / "src"),
            build,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert g.returncode == 0, g.stdout + g.stderr
    return r.stdout, [ln.strip() for ln in g.stdout.splitlines() if ln.strip()]


def test_alma_image_parses_with_the_access_recipes(parsed):
    out, _ = parsed
    assert "errors: 0  warnings: 0" in out
    recipes = next(ln for ln in out.splitlines() if "alma recipes in pn-buildlist" in ln)
    assert "alma-access" in recipes and "alma-board-id" in recipes and "alma-image" in recipes


def test_the_key_reaches_the_recipe_and_the_hook_the_flash_initrd(parsed):
    _, values = parsed
    keys, src_uri, rdepends = values[-3:]
    assert keys == ADMIN_PUB
    assert "file://alma-board-identity" in src_uri.split()  # the bbappend applies (meta-tegra present)
    assert {"alma-access-sshd", "alma-access-admin", "alma-board-id"} <= set(rdepends.split())
