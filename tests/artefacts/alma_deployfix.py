"""Build realistic meta-tegra scarthgap deploy dirs for tests (tmp/deploy/images/<MACHINE>).

Names follow oe-core image-artifact-names + kernel.bbclass + meta-tegra image_types_tegra
(scarthgap): timestamped real files behind IMAGE_LINK_NAME symlinks, a gzip'd tar bundle
whose members carry bare names (tar --transform=s,^\\./,,) including .env.initrd-flash as
written by create_tegraflash_pkg, a kernel image with a real-looking ``Linux version`` banner.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import run_cli

KREL = "5.15.185-l4t-r36.5-1033.33+g9c6d5c8154"
KPV = "5.15.185+git0+9c6d5c8154-r0"
BANNER = (
    "Linux version {rel} (oe-user@oe-host) (aarch64-oe-linux-gcc (GCC) 13.3.0, "
    "GNU ld (GNU Binutils) 2.42.0.20240723) #1 SMP PREEMPT Fri Nov 27 12:00:00 UTC 2026\n"
)
STAMP = "20261130120000"

# What .env.initrd-flash says per MACHINE, derived from the pinned layers (meta-tegra
# scarthgap at 37530d284a27b904c34a94ef5856015825749b06), not from memory:
#   BOOTDEV = TNSPEC_BOOTDEV, which defaults to TNSPEC_BOOTDEV_DEFAULT (conf/machine/include/
#     tegra-common.inc:26-27, both ??=). The first ?= that is *read* wins:
#     - jetson-orin-nano-devkit.conf requires orin-nano.inc at line 5, whose line 9 sets
#       TNSPEC_BOOTDEV_DEFAULT ?= "mmcblk0p1"; the machine file's own ?= "mmcblk1p1" (line 8)
#       comes later and changes nothing -> mmcblk0p1 (public scarthgap flash logs agree);
#     - jetson-orin-nano-devkit-nvme.conf:6 TNSPEC_BOOTDEV ?= "nvme0n1p1" (before its require);
#     - jetson-agx-orin-devkit: nothing sets it, tegra-common.inc:26 ??= "mmcblk0p1".
#   ROOTFS_DEVICE = tegra_rootfs_device() (classes-recipe/image_types_tegra.bbclass:16-21):
#     BOOTDEV with its trailing p<N> stripped.
#   EXTERNAL_ROOTFS_DRIVE = TEGRAFLASH_ROOTFS_EXTERNAL (image_types_tegra.bbclass:95): 1 when
#     TNSPEC_BOOTDEV differs from TNSPEC_BOOTDEV_DEFAULT.
#   DEFAULTS[BOARDID/FAB/BOARDSKU/BOARDREV]: orin-nano.inc:1-4 ("3767", "RC1", "0005", "B.4");
#     tegra234.inc:15-17 for the AGX devkit ("3701", "TS4", "0000", no BOARDREV).
#   DTBFILE: KERNEL_DEVICETREE, orin-nano.inc:16 / jetson-agx-orin-devkit.conf:7;
#   ODMDATA: orin-nano.inc:24 / agx-orin.inc:12. The file layout: image_types_tegra.bbclass:390-409.
MACHINES = {
    "jetson-orin-nano-devkit": ("mmcblk0p1", "mmcblk0", "3767"),
    "jetson-orin-nano-devkit-nvme": ("nvme0n1p1", "nvme0n1", "3767"),
    "jetson-agx-orin-devkit": ("mmcblk0p1", "mmcblk0", "3701"),
}
_BOARD = {  # BOARDID -> FAB, BOARDSKU, BOARDREV, DTBFILE, ODMDATA (sources above)
    "3767": (
        "RC1",
        "0005",
        "B.4",
        "tegra234-p3768-0000+p3767-0005-nv-super.dtb",
        "gbe-uphy-config-8,hsstp-lane-map-3,hsio-uphy-config-0",
    ),
    "3701": (
        "TS4",
        "0000",
        "",
        "tegra234-p3737-0000+p3701-0000-nv.dtb",
        "gbe-uphy-config-22,hsstp-lane-map-3,nvhs-uphy-config-0,hsio-uphy-config-0,gbe0-enable-10g",
    ),
}
COMPONENTS = ("alma-guard", "alma-health", "alma-watchdog-config", "eran-grid")


def env_text(machine: str, image: str, *, external: bool | None = None) -> str:
    """The bundle's .env.initrd-flash as meta-tegra's create_tegraflash_pkg writes it."""
    bootdev, rootdev, boardid = MACHINES.get(machine, ("mmcblk0p1", "mmcblk0", "3701"))
    if external is None:
        external = "nvme" in machine
    elif external:
        bootdev, rootdev = "nvme0n1p1", "nvme0n1"
    fab, sku, rev, dtb, odm = _BOARD[boardid]
    return f"""FLASH_HELPER=tegra-flash-helper.sh
BOOTDEV="{bootdev}"
ROOTFS_DEVICE="{rootdev}"
CHIPID="0x23"
MACHINE="{machine}"
DEFAULTS[BOARDID]="{boardid}"
DEFAULTS[FAB]="{fab}"
DEFAULTS[CHIPREV]=""
DEFAULTS[BOARDSKU]="{sku}"
DEFAULTS[BOARDREV]="{rev}"
DTBFILE="{dtb}"
EMMC_BCTS=""
ODMDATA="{odm}"
LNXFILE="boot.img"
ROOTFS_IMAGE="{image}.ext4"
DATAFILE=""
EXTERNAL_ROOTFS_DRIVE={1 if external else 0}
NO_INTERNAL_STORAGE=0
"""


def kernel_bytes(release: str = KREL, size: int = 3 << 20, banner_at: int | None = None, seed: int = 1) -> bytes:
    """A raw arm64 Image: 64-byte header with magic ARM\\x64 at 0x38, a banner in 'rodata'."""
    rnd = random.Random(seed)
    hdr = bytearray(64)
    hdr[0:4] = b"MZ@\xfa"  # EFI stub, as the real arm64 Image starts
    hdr[0x38:0x3C] = b"ARM\x64"
    body = bytearray(rnd.randbytes(size - 64))
    # a format string like the kernel's own, which is NOT the banner
    body[1000 : 1000 + 30] = b"Linux version %s (%s)\n\0\0\0\0\0\0\0\0"[:30]
    banner = BANNER.format(rel=release).encode() + b"\0"
    at = banner_at if banner_at is not None else size // 2
    body[at - 64 : at - 64 + len(banner)] = banner
    return bytes(hdr) + bytes(body)


@dataclass
class Deploy:
    dir: Path
    machine: str
    image: str
    bundle: Path  # the real (timestamped) file
    bundle_link: Path
    kernel: Path


def _tar_members(machine: str, image: str, env_machine: str, payload: int, with_env: bool) -> list[tuple[str, bytes]]:
    rnd = random.Random(machine)
    m = [
        ("bsp_version", b"36.5.0\n"),
        ("flash.xml.in", b'<?xml version="1.0"?>\n<partition_layout version="01.00.0000">\n</partition_layout>\n'),
        (
            "doflash.sh",
            f'#!/bin/sh\nMACHINE={machine} ./tegra-flash-helper.sh flash.xml.in boot.img {image}.ext4 "$@"\n'.encode(),
        ),
        ("initrd-flash", b"#!/bin/bash\n# OE4T initrd-flash\n"),
        ("tegraflash.py", b"#!/usr/bin/env python3\n"),
        ("tegrarcm_v2", b"\x7fELF" + b"\0" * 60),
        ("find-jetson-usb", b"#!/bin/bash\n"),
        ("make-sdcard", b"#!/bin/bash\n"),
        ("boot.img", rnd.randbytes(4096)),
        ("esp.img", rnd.randbytes(4096)),
        ("initrd-flash.img", rnd.randbytes(4096)),
        (f"{image}.ext4", rnd.randbytes(payload)),
    ]
    if with_env:
        m.insert(5, (".env.initrd-flash", env_text(env_machine, image).encode()))
    return m


def make_bundle(path: Path, members: list[tuple[str, bytes]]) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o755 if not name.endswith((".img", ".ext4", ".xml.in")) else 0o644
            tar.addfile(ti, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue(), compresslevel=6, mtime=0))


def build_deploy(
    base: Path,
    machine: str = "jetson-orin-nano-devkit",
    image: str = "alma-image",
    *,
    stamp: str = STAMP,
    release: str = KREL,
    manifest_release: str | None = None,
    env_machine: str | None = None,
    with_env: bool = True,
    gz_kernel: bool = False,
    components: tuple[str, ...] = COMPONENTS,
    payload: int = 200_000,
    kernel_size: int = 3 << 20,
    topdir: Path | None = None,
) -> Deploy:
    # where a real run puts it: kas TOPDIR = KAS_BUILD_DIR = build/<machine> (alma build),
    # TMPDIR = ${TOPDIR}/tmp-glibc (oe-core scarthgap defaultsetup.conf, non-poky distro)
    d = (topdir or base / "build" / machine) / "tmp-glibc" / "deploy" / "images" / machine
    d.mkdir(parents=True, exist_ok=True)
    real = f"{image}-{machine}.rootfs-{stamp}"
    link = f"{image}-{machine}.rootfs"

    bundle = d / f"{real}.tegraflash.tar.gz"
    make_bundle(bundle, _tar_members(machine, image, env_machine or machine, payload, with_env))
    os.symlink(bundle.name, d / f"{link}.tegraflash.tar.gz")

    (d / f"{real}.ext4").write_bytes(b"\0" * 1024 + b"\x53\xef" + os.urandom(5000))
    os.symlink(f"{real}.ext4", d / f"{link}.ext4")

    mrel = manifest_release or release
    mach_arch = machine.replace("-", "_")
    pkgs = {
        "base-files": (mach_arch, "3.0.14-r0"),
        "busybox": ("armv8a", "1.36.1-r0"),
        "systemd": ("armv8a", "1:255.21-r0"),
        f"kernel-{mrel}": (mach_arch, KPV),
        f"kernel-image-image-{mrel}": (mach_arch, KPV),
        f"kernel-module-nvgpu-{mrel}": (mach_arch, "36.5.0-r0"),
        "tegra-firmware": ("armv8a", "36.5.0-r0"),
        **{c: ("all" if c == "alma-watchdog-config" else "armv8a", "0.1.0-r0") for c in components},
    }
    (d / f"{real}.manifest").write_text("".join(f"{k} {a} {v}\n" for k, (a, v) in sorted(pkgs.items())))
    os.symlink(f"{real}.manifest", d / f"{link}.manifest")

    if (d / f"Image-{machine}.bin").exists() or (d / f"Image.gz-{machine}.bin").exists():
        # a second image in the same deploy dir shares the machine's kernel
        return Deploy(d, machine, image, bundle, d / f"{link}.tegraflash.tar.gz", (d / "Image").resolve())
    kdata = kernel_bytes(release, kernel_size)
    kreal = d / f"Image--{KPV}-{machine}-20240101000000.bin"
    if gz_kernel:
        kreal = d / f"Image.gz--{KPV}-{machine}-20240101000000.bin"
        kreal.write_bytes(gzip.compress(kdata, mtime=0))
        os.symlink(kreal.name, d / f"Image.gz-{machine}.bin")
        os.symlink(kreal.name, d / "Image.gz")
    else:
        kreal.write_bytes(kdata)
        os.symlink(kreal.name, d / f"Image-{machine}.bin")
        os.symlink(kreal.name, d / "Image")
    return Deploy(d, machine, image, bundle, d / f"{link}.tegraflash.tar.gz", kreal)


def make_project(root: Path) -> Path:
    """A project checkout as settings.repo_root() recognizes it (kas/ + layers/)."""
    for d in ("kas", "layers", "facts", "docs/gates"):
        (root / d).mkdir(parents=True, exist_ok=True)
    return root


@dataclass
class Run:
    code: int
    out: str
    err: str


def run_alma(capsys, *args: str) -> Run:  # type: ignore[no-untyped-def]
    """Run the real CLI entry point in-process (exit-code mapping included)."""
    return Run(*run_cli(capsys, *args))


# Fixtures shared by tests/artefacts and tests/gates (their conftests import them).
@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    root = make_project(tmp_path / "proj")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def alma(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    return lambda *args: run_alma(capsys, *args)
