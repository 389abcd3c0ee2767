"""A .swu made as meta-swupdate makes it (cpio -H crc), read back with bounds, installed (or refused)
by the REAL SWUpdate."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support_swu import build_swu
from support_update import MACHINE, make_cert, require_swupdate, rootfs_image, swupdate_argv

from alma.update.swu import SwuError, read_swu


def _swu(tmp: Path, signer: tuple[bytes, bytes], machine: str = MACHINE) -> tuple[Path, Path]:
    img = rootfs_image(tmp / "rootfs.ext4", "2.0.0")
    out = tmp / "u.swu"
    build_swu(out, machine=machine, version="2.0.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1], root="")
    return out, img


def _install(tmp: Path, swu: Path, cert: bytes, machine: str = MACHINE) -> tuple[int, str, Path]:
    require_swupdate()
    board = tmp / "board"
    slot = board / "dev/disk/by-partlabel/APP_b"
    slot.parent.mkdir(parents=True, exist_ok=True)
    slot.write_bytes(b"\0" * 200_000)
    (tmp / "cert.pem").write_bytes(cert)
    (tmp / "swtmp").mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp / "swtmp")}  # SWUpdate extracts there (and cleans up)
    r = subprocess.run([*swupdate_argv("-k", str(tmp / "cert.pem"), "-H", f"{machine}:1.0", "-e", "alma,slot-b", "-i",
                        str(swu))], cwd=board, capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    return r.returncode, r.stdout + r.stderr, slot


def test_real_swupdate_installs_a_meta_swupdate_made_swu_into_the_inactive_slot(tmp_path: Path,
                                                                      signer: tuple[bytes, bytes]) -> None:  # fmt: skip
    swu, img = _swu(tmp_path, signer)
    info = read_swu(swu)
    assert info.signed and info.machine == MACHINE and info.version == "2.0.0" and info.hashes_checked
    assert swu.read_bytes()[:6] == b"070702" and info.format == "crc"  # what meta-swupdate's cpio -H crc writes
    assert info.signers == [] and info.verified is None  # no fleet certificate given: nothing claimed
    (tmp_path / "fleet.pem").write_bytes(signer[0])
    assert read_swu(swu, cert=tmp_path / "fleet.pem").signers[0]["subject"] == "CN=ALMA-OS OTA test"
    _, log, slot = _install(tmp_path, swu, signer[0])
    assert "SWUPDATE successful" in log, log
    assert slot.read_bytes()[: img.stat().st_size] == img.read_bytes()


def test_real_swupdate_refuses_a_tampered_payload(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    swu, img = _swu(tmp_path, signer)
    data = bytearray(swu.read_bytes())
    data[data.index(img.read_bytes()[:64]) + 5000] ^= 0x01
    swu.write_bytes(bytes(data))
    with pytest.raises(SwuError, match="does not match its signed sha256"):
        read_swu(swu)
    _, log, _ = _install(tmp_path, swu, signer[0])
    assert "HASH mismatch" in log and "SWUPDATE successful" not in log


def test_real_swupdate_refuses_another_signer(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    swu, _ = _swu(tmp_path, signer)
    other, _ = make_cert(tmp_path / "other", cn="someone else")
    rc, log, _ = _install(tmp_path, swu, other)
    assert rc != 0 and "Authentication of all signatures failed" in log and "SWUPDATE successful" not in log


def test_real_swupdate_refuses_a_swu_for_another_machine(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    swu, _ = _swu(tmp_path, signer, machine="jetson-orin-nano-devkit")
    rc, log, slot = _install(tmp_path, swu, signer[0])
    assert rc != 0 and "SWUPDATE successful" not in log
    assert slot.read_bytes() == b"\0" * 200_000


@pytest.mark.parametrize("cut", [10, 200, 4000])
def test_reader_refuses_a_truncated_swu(tmp_path: Path, signer: tuple[bytes, bytes], cut: int) -> None:
    swu, _ = _swu(tmp_path, signer)
    data = swu.read_bytes()
    swu.write_bytes(data[: len(data) - 512 - cut] if cut > 100 else data[:cut])
    with pytest.raises(SwuError):
        read_swu(swu)


def test_reader_refuses_an_unsigned_or_foreign_first_member(tmp_path: Path) -> None:
    p = tmp_path / "x.swu"
    p.write_bytes(b"not a cpio archive" * 20)
    with pytest.raises(SwuError, match="not a cpio archive"):
        read_swu(p)


def test_a_newc_swu_reads_the_same(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    img = rootfs_image(tmp_path / "rootfs.ext4", "2.0.0")
    out = build_swu(tmp_path / "n.swu", machine=MACHINE, version="2.0.0", rootfs=img, cert_pem=signer[0],
                    key_pem=signer[1], root="", fmt="newc")  # fmt: skip
    info = read_swu(out)
    assert info.format == "newc" and info.hashes_checked and info.payloads[0].size == img.stat().st_size
