"""Read a bundle's ``.env.initrd-flash`` (written by meta-tegra's image_types_tegra.bbclass).

The real script sources it with bash; we never execute it. Lines are ``KEY="value"``,
``KEY=value`` or ``DEFAULTS[BOARDID]="..."``; values are unquoted with shlex.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from alma.errors import UserError

ENV_NAME = ".env.initrd-flash"
_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<sub>[A-Za-z0-9_]+)\])?=(?P<val>.*)$")


@dataclass
class FlashEnv:
    values: dict[str, str]
    defaults: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    def get(self, key: str, default: str = "") -> str:
        return self.values.get(key, default)

    @property
    def machine(self) -> str:
        return self.values["MACHINE"]

    @property
    def chipid(self) -> str:
        return self.values.get("CHIPID", "").lower()

    @property
    def rootfs_device(self) -> str:
        return self.values.get("ROOTFS_DEVICE", "")

    @property
    def bootdev(self) -> str:
        return self.values.get("BOOTDEV", "")

    def payload_files(self) -> list[str]:
        """Bundle files the flash only reads (the rootfs image, the data partition image)."""
        return [v for v in (self.get("ROOTFS_IMAGE"), self.get("DATAFILE")) if v and "/" not in v]


def parse_env(text: str, path: Path | None = None) -> FlashEnv:
    values: dict[str, str] = {}
    defaults: dict[str, str] = {}
    where = str(path or ENV_NAME)
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise UserError(
                f"{where}:{n}: not a KEY=value line: {raw!r}", hint="rebuild the bundle (bitbake writes this file)"
            )
        try:
            parts = shlex.split(m["val"], comments=True)
        except ValueError as exc:
            raise UserError(f"{where}:{n}: {exc}", hint="rebuild the bundle (bitbake writes this file)") from exc
        value = " ".join(parts)
        if m["sub"]:
            defaults[m["sub"]] = value
        else:
            values[m["key"]] = value
    if not values.get("MACHINE"):
        raise UserError(f"{where}: no MACHINE", hint="rebuild the bundle with IMAGE_TEGRAFLASH_INITRD_FLASHER set")
    return FlashEnv(values, defaults, path)


def read_env(bundle_dir: Path) -> FlashEnv:
    path = bundle_dir / ENV_NAME
    if not path.is_file():
        raise UserError(
            f"the bundle has no {ENV_NAME}: not an initrd-flash bundle",
            hint="build it with meta-tegra scarthgap (Orin bundles carry initrd-flash); doflash.sh bundles "
            "are not supported by alma flash",
        )
    return parse_env(path.read_text(encoding="utf-8", errors="replace"), path)
