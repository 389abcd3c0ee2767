"""What meta-tegra (scarthgap) names its artefacts inside a deploy dir (where the deploy dir
is: :mod:`alma.buildtree`).

``tmp/deploy/images/<MACHINE>/`` (DEPLOY_DIR_IMAGE) holds, per oe-core image-artifact-names:
IMAGE_LINK_NAME = ``<image>-<machine>.rootfs`` (symlinks) and
IMAGE_NAME = ``<image>-<machine>.rootfs-<YYYYMMDDHHMMSS>`` (the real files, DATETIME in UTC):

- ``<link>.tegraflash.tar.gz`` -> ``<name>.tegraflash.tar.gz`` (or ``.tegraflash.zip``)
- ``<link>.ext4`` -> ``<name>.ext4``, ``<link>.manifest`` -> ``<name>.manifest``
- kernel (kernel.bbclass): ``Image-<machine>.bin`` and ``Image`` -> ``Image-<pkgv>-<pkgr>-<machine>-<stamp>.bin``
  (the kernel's stamp is SOURCE_DATE_EPOCH, not the build time), ``Image.gz-<machine>.bin``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from alma.ground import utc_iso

BUNDLE_EXTS = (".tegraflash.tar.gz", ".tegraflash.zip")
KERNEL_NAMES = ("Image-{machine}.bin", "Image", "Image.gz-{machine}.bin", "Image.gz")
STAMP = re.compile(r"\.rootfs-(\d{14})\.")


@dataclass
class Located:
    link: Path  # the name we looked for (usually a symlink)
    real: Path | None  # where it resolves to; None when dangling
    dangling: bool

    @property
    def path(self) -> Path:
        return self.real or self.link


def locate(path: Path) -> Located | None:
    """None when the name does not exist at all (not even as a broken symlink)."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink():
        target = path.resolve()
        return Located(path, target if target.exists() else None, not target.exists())
    return Located(path, path, False)


def link_name(image: str, machine: str) -> str:
    return f"{image}-{machine}.rootfs"


def find_bundle(deploy: Path, image: str, machine: str) -> Located | None:
    for ext in BUNDLE_EXTS:
        found = locate(deploy / (link_name(image, machine) + ext))
        if found:
            return found
    return None


def find_kernel(deploy: Path, machine: str) -> Located | None:
    for pattern in KERNEL_NAMES:
        found = locate(deploy / pattern.format(machine=machine))
        if found:
            return found
    return None


def images_in(deploy: Path, machine: str) -> list[str]:
    """Image names with a bundle link for ``machine`` (broken links included)."""
    out = set()
    suffixes = [f"-{machine}.rootfs{ext}" for ext in BUNDLE_EXTS]
    try:
        names = os.listdir(deploy)
    except OSError:
        return []
    for name in names:
        for suf in suffixes:
            if name.endswith(suf) and len(name) > len(suf):
                out.add(name[: -len(suf)])
    return sorted(out)


def stamped_siblings(deploy: Path, image: str, machine: str) -> list[Path]:
    prefix = link_name(image, machine) + "-"
    return sorted(p for p in deploy.glob(prefix + "*.tegraflash.*") if STAMP.search(p.name))


def stamp_time(name: str) -> str | None:
    """ISO time of the DATETIME stamp in a real artefact name (bitbake's DATE/TIME are UTC)."""
    m = STAMP.search(name)
    if not m:
        return None
    try:
        t = datetime.strptime(m.group(1), "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return utc_iso(t)


def buildhistory_dir(deploy: Path, image: str, machine: str) -> Path:
    """BUILDHISTORY_DIR_IMAGE: ``${TOPDIR}/buildhistory/images/${MACHINE_ARCH}/glibc/<image>``;
    deploy is ``${TOPDIR}/<tmp>/deploy/images/<machine>``."""
    topdir = deploy.resolve().parents[3] if len(deploy.resolve().parents) > 3 else deploy
    return topdir / "buildhistory" / "images" / machine.replace("-", "_") / "glibc" / image
