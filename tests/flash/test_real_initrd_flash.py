"""`alma flash` running meta-tegra's REAL initrd-flash.sh and find-jetson-usb.sh (from the
meta-tegra mirror at the commit kas/alma.lock.yml pins), not the simulator, as far as a host
without a Jetson can go: the board found in umockdev's sysfs by the real find-jetson-usb,
Step 1 (a pre-signed bundle: the signing step's own writes), Step 2 (RCM boot through the
rcm-boot.sh the script writes; NVIDIA's tegrarcm_v2 is the one fake), Step 3's wait for the
flashpkg gadget, which no host here exports: alma's phase limit ends it, naming it.

It checks the protocol alma parses (banners, phases, the reason) against the script itself,
and the per-board copies against the script's real writes: they land in the board's own
copy, the master and the shared payload are untouched.

    ALMA_META_TEGRA_MIRROR=/work/upstream/i33/meta-tegra.git \\
        .venv/bin/python -m pytest -q tests/flash/test_real_initrd_flash.py
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from artefacts.alma_deployfix import env_text
from artefacts.test_fixture_provenance import MIRROR, _pinned
from support_flash import IMAGE, Station, sha256, tar_gz

NANO = "jetson-orin-nano-devkit"
SCRIPTS = "recipes-bsp/tegra-binaries/tegra-helper-scripts"

FAKE_TEGRARCM = """#!/bin/sh
# NVIDIA's tegrarcm_v2 (not in meta-tegra; it talks to the BootROM over USB): a board that answers.
echo "[   0.0383 ] tegrarcm_v2 $*"
echo "BR_CID: 0x80012344705DD1C8000000000EFF0180"
exit 0
"""


def _real(name: str) -> str:
    if not (MIRROR / "HEAD").exists() and not (MIRROR / ".git").exists():
        pytest.skip(f"no meta-tegra mirror at {MIRROR} (set ALMA_META_TEGRA_MIRROR)")
    r = subprocess.run(
        ["git", "-C", str(MIRROR), "show", f"{_pinned()}:{SCRIPTS}/{name}"], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"meta-tegra mirror at {MIRROR} has no {name} at the pinned commit: {r.stderr.strip()[:200]}")
    return r.stdout


def _presigned_tree(tree: Path) -> Path:
    """A pre-signed bundle as meta-tegra's create_tegraflash_pkg lays it out (the signed
    binaries are stand-ins: nothing here checks a signature)."""
    tree.mkdir(parents=True)
    for name, text in (
        ("initrd-flash", _real("initrd-flash.sh")),
        ("find-jetson-usb", _real("find-jetson-usb.sh")),
        ("tegrarcm_v2", FAKE_TEGRARCM),
    ):
        (tree / name).write_text(text)
        os.chmod(tree / name, 0o755)
    (tree / ".env.initrd-flash").write_text(env_text(NANO, IMAGE))
    (tree / ".presigning-vars").write_text("")  # signed at build time: Step 1 only copies
    (tree / "doflash.sh").write_text("#!/bin/sh\npython3 tegraflash.py --cfg secureflash.xml --chip 0x23\n")
    (tree / "secureflash.xml").write_text('<?xml version="1.0"?>\n<partition_layout version="01.00.0000"/>\n')
    (tree / "flash.xml.in").write_text('<?xml version="1.0"?>\n<partition_layout version="01.00.0000"/>\n')
    # SPI (3:0) entries: copy_bootloader_files stages them for the flash package
    (tree / "flash.idx").write_text(
        "0, 3:0:A_mb1, 0, 262144, mb1_t234_prod_aligned_sigheader.bin.encrypt, 8, 0\n"
        "1, 3:0:A_MB1_BCT, 262144, 262144, mb1_bct_MB1_sigheader.bct.encrypt, 8, 0\n"
    )
    (tree / "mb1_t234_prod_aligned_sigheader.bin.encrypt").write_bytes(os.urandom(4096))
    (tree / "mb1_bct_MB1_sigheader.bct.encrypt").write_bytes(os.urandom(4096))
    (tree / "rcmboot_blob").mkdir()
    (tree / "rcmboot_blob" / "rcmbootcmd.txt").write_text(
        "./tegrarcm_v2 --new_session --chip 0x23 0 --uid --download bct_br br_bct_BR.bct\n"
    )
    (tree / "boot.img").write_bytes(os.urandom(64 << 10))
    with open(tree / f"{IMAGE}.ext4", "wb") as fh:  # ROOTFS_IMAGE: the one shared payload
        fh.truncate(16 << 20)
        fh.seek(1024)
        fh.write(os.urandom(4096))
    return tree


def test_alma_flash_drives_meta_tegra_s_real_initrd_flash_to_the_flashpkg_wait(station: Station) -> None:
    tree = _presigned_tree(station.base / "tree-real")
    deploy = station.base / "deploy" / NANO
    deploy.mkdir(parents=True)
    b = tar_gz(tree, deploy / f"{IMAGE}-{NANO}.rootfs-20261130120000.tegraflash.tar.gz")
    station.manifest(b)
    image_sha = sha256(tree / f"{IMAGE}.ext4")
    r = station.alma("flash", "--yes", "--console", "none", "--keep-work", "--phase-timeout", "flashpkg=3")
    assert r.returncode == 4, r.stderr  # a phase timed out: the flashpkg wait no host here ends
    (rec,) = station.records_list()
    phases = [(p["name"], p["result"]) for p in rec["phases"]]  # type: ignore[union-attr, index]
    names = [n for n, _ in phases]
    # the real script's banners and waits, in alma's phases, in order
    assert names[-4:] == ["wait-board", "sign", "rcm-boot", "flashpkg"], phases
    assert all(res == "ok" for _, res in phases[:-1]) and phases[-1] == ("flashpkg", "timeout"), phases
    assert rec["result"] == "TIMEOUT" and "flashpkg" in str(rec["reason"]), rec
    transcript = (station.records / str(rec["logs"]["transcript"])).read_text()  # type: ignore[index]
    assert transcript.count("Found Jetson device in recovery mode at USB 1-3") == 2  # the real find-jetson-usb
    assert "Waiting for USB storage device flashpkg" in transcript
    # the script's writes went into this board's own copy; the master and the payload did not move
    (board,) = station.work.glob("run-*/boards/1-3")
    for wrote in ("flash_signed.sh", "internal-secureflash.xml", "rcm-boot.sh", "bootloader_staging/partitions.conf"):
        assert (board / wrote).is_file(), wrote
    assert "internal-secureflash.xml" in (board / "flash_signed.sh").read_text()  # its sed -i ran
    (master,) = station.work.glob("run-*/bundle")
    assert not (master / "flash_signed.sh").exists() and not (master / "bootloader_staging").exists()
    assert sha256(board / f"{IMAGE}.ext4") == image_sha == sha256(master / f"{IMAGE}.ext4")
