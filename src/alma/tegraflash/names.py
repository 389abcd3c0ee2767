"""Bundle names as meta-tegra (scarthgap) and oe-core's image-artifact-names make them.

IMAGE_LINK_NAME ``<image>-<machine>.rootfs`` is a symlink to IMAGE_NAME
``<image>-<machine>.rootfs-<YYYYMMDDHHMMSS>``; the bundle adds ``.tegraflash.tar.gz``
(``TEGRAFLASH_PACKAGE_FORMAT = "tar"``, the default) or ``.tegraflash.zip``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAR_EXT = ".tegraflash.tar.gz"
ZIP_EXT = ".tegraflash.zip"
BUNDLE_EXTS = (TAR_EXT, ZIP_EXT)
# meta-tegra (and oe-core) MACHINE names: lower-case words joined by '-' or '_'
# (jetson-orin-nano-devkit, p3768-0000-p3767-0000). Checked before a MACHINE from a
# bundle, a manifest or the command line becomes part of any path (a record's name).
MACHINE_GRAMMAR = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_NAME = re.compile(r"^(?P<stem>.+)\.rootfs(?:-(?P<stamp>\d{14}))?\.tegraflash\.(?P<fmt>tar\.gz|zip)$")


@dataclass(frozen=True)
class BundleName:
    stem: str  # "<image>-<machine>" (the split is ambiguous: both may contain '-')
    stamp: str | None  # DATETIME, UTC
    fmt: str  # "tar.gz" | "zip"

    def is_for(self, image: str, machine: str) -> bool:
        return self.stem == f"{image}-{machine}"


def parse_name(name: str) -> BundleName | None:
    m = _NAME.match(name)
    return BundleName(m["stem"], m["stamp"], m["fmt"]) if m else None


def is_zip(name: str) -> bool:
    return name.endswith(ZIP_EXT) or name.endswith(".zip")


# What verify and flash both say of a zip bundle: alma flash unpacks tar.gz bundles only.
ZIP_REFUSAL = 'a zip bundle (TEGRAFLASH_PACKAGE_FORMAT = "zip"): alma flash unpacks tar.gz bundles, not zips'
ZIP_HINT = 'build with TEGRAFLASH_PACKAGE_FORMAT = "tar" (the default), or unzip it and run its initrd-flash'


def link_name(image: str, machine: str, fmt: str = "tar.gz") -> str:
    return f"{image}-{machine}.rootfs.tegraflash.{fmt}"


def is_machine(value: object) -> bool:
    return isinstance(value, str) and MACHINE_GRAMMAR.fullmatch(value) is not None
