"""``<image>-<machine>.rootfs.manifest``: one ``<pkg> <arch> <version>`` line per installed
package (oe-core ``write_image_manifest`` / ``format_pkg_list(..., "ver")``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from alma.errors import UserError
from alma.ground import open_regular

# The components ALMA-OS bakes into every image (layers/meta-alma/recipes-alma/).
COMPONENTS = ("alma-guard", "alma-watchdog-config", "alma-health", "eran-grid")

# kernel.bbclass names the base package kernel-${KERNEL_VERSION} (legitimized); the image
# type packages kernel-image-<type>-${KERNEL_VERSION}.
_KPKG = re.compile(r"^kernel-(?:image-[a-z0-9.]+-)?(\d+\.\d+(?:\.\d+)?[a-z0-9.+-]*)$")


@dataclass
class RootfsManifest:
    packages: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (arch, version)

    @property
    def count(self) -> int:
        return len(self.packages)

    def components(self) -> dict[str, bool]:
        return {c: c in self.packages for c in COMPONENTS}

    def kernel_release(self) -> tuple[str, str] | None:
        """(release, package name) from the kernel package names, or None."""
        for name in sorted(self.packages):
            m = _KPKG.match(name)
            if m and not name.startswith("kernel-module"):
                return m.group(1), name
        return None


def legitimize(release: str) -> str:
    """oe.utils legitimize_package_name: what a release looks like inside a package name."""
    return release.lower().replace("_", "-").replace("@", "+").replace(",", "+").replace("/", "-")


def read_rootfs_manifest(path: Path) -> RootfsManifest:
    out = RootfsManifest()
    with os.fdopen(open_regular(path), "rb") as fh:  # a FIFO in the deploy dir never blocks verify
        text = fh.read().decode("utf-8", "replace")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            raise UserError(
                f"{path}:{n}: expected '<pkg> <arch> <version>', got {line.strip()!r}",
                hint="this is not an oe-core image manifest; rebuild the image",
            )
        out.packages[parts[0]] = (parts[1], parts[2])
    if not out.packages:
        raise UserError(f"{path}: empty image manifest", hint="rebuild the image")
    return out
