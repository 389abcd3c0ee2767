"""The one parser of a bundle's ``.env.initrd-flash`` (written by meta-tegra's
``image_types_tegra.bbclass``, ``create_tegraflash_pkg``).

The real ``initrd-flash`` sources it with bash; we never execute it. Lines are
``KEY="value"``, ``KEY=value`` or ``DEFAULTS[BOARDID]="..."``; values are unquoted with shlex
(no expansion: ``$(...)`` stays text). Anything else is an error with its line number: one
strict parser, so ``alma verify`` and ``alma flash`` can never read one file two ways.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from almaboard.text import terminal

from alma.errors import UserError
from alma.tegraflash.names import is_machine

ENV_NAME = ".env.initrd-flash"
ENV_MAX = 64 * 1024  # the real file is under 1 KiB; refuse anything absurd
_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<sub>[A-Za-z0-9_]+)\])?=(?P<val>.*)$")
_HINT = "rebuild the bundle (bitbake writes this file)"


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

    def flat(self) -> dict[str, str]:
        """``KEY`` and ``DEFAULTS[KEY]`` in one dict (the facts manifest's view)."""
        return {**self.values, **{f"DEFAULTS[{k}]": v for k, v in self.defaults.items()}}


def parse_env(text: str, path: Path | str | None = None) -> FlashEnv:
    values: dict[str, str] = {}
    defaults: dict[str, str] = {}
    where = str(path or ENV_NAME)
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise UserError(f"{where}:{n}: not a KEY=value line: {raw!r}", hint=_HINT)
        try:
            parts = shlex.split(m["val"], comments=True)
        except ValueError as exc:
            raise UserError(f"{where}:{n}: {exc}", hint=_HINT) from exc
        value = " ".join(parts)
        if m["sub"]:
            defaults[m["sub"]] = value
        else:
            values[m["key"]] = value
    if not values.get("MACHINE"):
        raise UserError(f"{where}: no MACHINE", hint="rebuild the bundle with IMAGE_TEGRAFLASH_INITRD_FLASHER set")
    if not is_machine(values["MACHINE"]):
        # the bundle's words never choose a path: MACHINE names the flash record
        raise UserError(
            f"{where}: MACHINE={terminal(values['MACHINE'][:200])!r} is not a meta-tegra machine name "
            "(lower-case letters, digits, '-' and '_'); refused",
            hint=_HINT,
        )
    return FlashEnv(values, defaults, Path(path) if path else None)


def decode_env(data: bytes, path: Path | str | None = None) -> FlashEnv:
    if len(data) > ENV_MAX:
        raise UserError(f"{path or ENV_NAME}: {len(data)} bytes, not a small env file", hint=_HINT)
    return parse_env(data.decode("utf-8", "replace"), path)


def read_env(bundle_dir: Path) -> FlashEnv:
    path = bundle_dir / ENV_NAME
    if not path.is_file():
        raise UserError(
            f"the bundle has no {ENV_NAME}: not an initrd-flash bundle",
            hint="build it with meta-tegra scarthgap (Orin bundles carry initrd-flash); doflash.sh bundles "
            "are not supported by alma flash",
        )
    return decode_env(path.read_bytes(), path)
