"""``alma verify``'s view of a tegraflash bundle: the one reader in alma.tegraflash.

meta-tegra (scarthgap, image_types_tegra.bbclass) writes the bundle with
``tar --sparse --numeric-owner --transform=s,^\\./,, -cf- . | gzip -9 -n --rsyncable``. The
bundle is read once (sha256 and members together, alma.tegraflash.stream) and every member
passes the same checks ``alma flash`` applies before unpacking (alma.tegraflash.members), so
a bundle verify accepts is one flash accepts, and a hostile one is refused by both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alma.errors import UserError
from alma.tegraflash import reader
from alma.tegraflash.envfile import ENV_NAME
from alma.tegraflash.members import UnsafeBundle
from alma.tegraflash.reader import REQUIRED_MEMBERS, BundleScan
from alma.tegraflash.stream import CorruptBundle, Progress, zlib_module

ENV_MEMBER = ENV_NAME
__all__ = ["ENV_MEMBER", "REQUIRED_MEMBERS", "BundleScan", "Progress", "scan_bundle"]


def _zlib() -> Any:
    return zlib_module()


def scan_bundle(path: Path, progress: Progress | None = None) -> BundleScan:
    """sha256 + env + checked members of a ``.tegraflash.tar.gz`` or ``.tegraflash.zip``."""
    try:
        return reader.scan(path, progress)
    except UnsafeBundle as exc:
        raise UserError(
            f"{path}: unsafe bundle: {exc.why} (alma flash refuses it too)",
            hint="rebuild the image (bitbake <image>); never flash a bundle from an unknown source",
        ) from exc
    except CorruptBundle as exc:
        raise UserError(
            f"{path}: not a readable tegraflash tar.gz bundle: {exc.why}",
            hint="rebuild the image (bitbake <image>) or copy the bundle again; compare its size",
        ) from exc
