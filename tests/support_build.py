"""Helpers for the build and lint tests: a small ALMA-OS checkout, fake kas/bitbake, healthy probes."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from alma.imagebuild import preflight as pf

FAKES = Path(__file__).parent / "imagebuild" / "fakes"
BITBAKE_SHA = "0880963fea4d91a034e4a6e007d23f98658ab986"
OE_SHA = "543550522f831479f07d332a40ba343c53ae1065"
MACHINES = ("jetson-orin-nano-devkit", "jetson-orin-nano-devkit-nvme", "jetson-agx-orin-devkit")

BASE = f"""\
header:
  version: 14
distro: alma
target: alma-image
repos:
  meta-alma:
    layers:
      layers/meta-alma:
  bitbake:
    url: https://git.openembedded.org/bitbake
    commit: {BITBAKE_SHA}
    layers:
      .: disabled
  openembedded-core:
    url: https://git.openembedded.org/openembedded-core
    commit: {OE_SHA}
    layers:
      meta:
local_conf_header:
  alma: |
    INHERIT += "buildhistory"
"""


# A public key for the image's admin user (a release build needs one); its private
# half was thrown away. Installed as the test HOME's default ~/.ssh/id_ed25519.pub.
ADMIN_PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHxwDNvVOwmiEyaJ1o7PA9VXHKwmPXqtb8QUke0KYs5/ fixture@alma"
ADMIN_FPR = "SHA256:6kMpmbGgtFqJ6WpfjJYxmtZmYPO/85YCdVbzJCm3Bvs"


def install_default_admin_key(home: Path) -> Path:
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "id_ed25519.pub").write_text(ADMIN_PUB + "\n")
    return ssh / "id_ed25519.pub"


def make_project(root: Path) -> Path:
    (root / "kas" / "machines").mkdir(parents=True)
    (root / "kas" / "features").mkdir()
    (root / "kas" / "alma.yml").write_text(BASE)
    for m in MACHINES:
        (root / "kas" / "machines" / f"{m}.yml").write_text(
            f"header:\n  version: 14\n  includes:\n    - kas/alma.yml\nmachine: {m}\n"
        )
    for f in ("release", "development", "shared-sstate"):
        (root / "kas" / "features" / f"{f}.yml").write_text(
            f"header:\n  version: 14\nlocal_conf_header:\n  {f}: |\n    # {f}\n"
        )
    images = root / "layers" / "meta-alma" / "recipes-core" / "images"
    images.mkdir(parents=True)
    (images / "alma-image.bb").write_text('SUMMARY = "ALMA-OS image"\nLICENSE = "MIT"\ninherit core-image\n')
    (root / "layers" / "meta-alma" / "conf").mkdir()
    (root / "layers" / "meta-alma" / "conf" / "layer.conf").write_text('BBFILE_COLLECTIONS += "alma"\n')
    # kas needs the checkout to be a repository (its root is the base of every include)
    subprocess.run(["git", "init", "-q", str(root)], check=True, capture_output=True)
    return root


def mark_checked_out(root: Path, *repos: str) -> None:
    for r in repos or ("bitbake", "openembedded-core"):
        (root / "build" / r / ".git").mkdir(parents=True, exist_ok=True)


def install_fakes(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("kas", "bitbake"):
        dst = bin_dir / name
        dst.write_text(f"#!{sys.executable}\n" + (FAKES / name).read_text())
        dst.chmod(dst.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def read_record(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


GOOD = dict(
    euid=lambda: 1000,
    which=lambda t: f"/usr/bin/{t}",
    disk_free=lambda p: 500 * pf.GB,
    mem_total=lambda: 64 * pf.GIB,
    cpu_count=lambda: 8,
    locales=lambda: {"c.utf8", "en_us.utf8", "posix"},
    ls_remote=lambda url, timeout, env: None,
    access=lambda path, mode: True,
    owner=lambda path: 1000,
    user_name=lambda uid: {0: "root", 1000: "builder"}.get(uid, str(uid)),
    env={},
)


# `alma build` in a child process with healthy preflight probes (root, disk, RAM, network
# faked healthy), for tests that need a real process: a pty, a real SIGINT.
DRIVER = """
import sys
from alma.imagebuild import preflight as pf
healthy = pf.Probes(euid=lambda: 1000, which=lambda t: "/usr/bin/" + t, disk_free=lambda p: 500 * pf.GB,
                    mem_total=lambda: 64 * pf.GIB, cpu_count=lambda: 8, locales=lambda: {"en_us.utf8"},
                    ls_remote=lambda url, t, env: None, access=lambda p, m: True, owner=lambda p: 1000,
                    user_name=lambda uid: "builder", env={})
pf.default_probes = lambda: healthy
from alma.cli.main import main
main(sys.argv[1:])
"""
