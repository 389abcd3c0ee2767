"""One-pass verify + unpack: real tar.gz files (GNU tar --sparse, as meta-tegra makes them),
and hostile or broken archives that must be refused without leaving anything behind."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from support_flash import sha256, tar_gz

from alma.errors import UserError
from alma.flash import bundle
from alma.tegraflash.unpack import unpack


def _digest_of(path: Path) -> str:
    return sha256(path)


@pytest.mark.parametrize("fmt", [(), ("--format=posix",)], ids=["gnu-sparse", "pax-sparse"])
def test_unpacks_sparse_members_with_holes_and_the_hash_of_the_whole_file(
    tmp_path: Path, make_tree: Callable[..., Path], fmt: tuple[str, ...]
) -> None:
    tree = make_tree()
    b = tar_gz(tree, tmp_path / "b.tar.gz", *fmt)
    prepared = bundle.prepare(b, tmp_path / "work", _digest_of(b))
    img = prepared.root / "alma-image.ext4"
    assert img.read_bytes() == (tree / "alma-image.ext4").read_bytes()
    assert img.stat().st_size == 16 << 20
    assert img.stat().st_blocks * 512 < 1 << 20  # holes stayed holes
    assert prepared.sha256 == _digest_of(b)
    assert prepared.env.machine == "jetson-orin-nano-devkit" and prepared.env.chipid == "0x23"
    assert os.access(prepared.root / "initrd-flash", os.X_OK)
    assert (prepared.root / "bootloader" / "mb1_t234_prod.bin").read_bytes() == (
        tree / "bootloader" / "mb1_t234_prod.bin"
    ).read_bytes()
    assert oct((tmp_path / "work").stat().st_mode & 0o777) == "0o700"
    assert not list((tmp_path / "work").glob(".extract-*"))


def test_hash_mismatch_refuses_and_leaves_nothing(tmp_path: Path, make_tree: Callable[..., Path]) -> None:
    b = tar_gz(make_tree(), tmp_path / "b.tar.gz")
    before = b.read_bytes()
    with pytest.raises(UserError) as ei:
        bundle.prepare(b, tmp_path / "work", "0" * 64)
    assert "sha256 mismatch" in ei.value.message and _digest_of(b) in ei.value.message
    assert ei.value.exit_code == 2
    assert list((tmp_path / "work").iterdir()) == []
    assert b.read_bytes() == before


def _hostile(tmp_path: Path, add: Callable[[tarfile.TarFile], None]) -> Path:
    out = tmp_path / "hostile.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        env = b'MACHINE="jetson-orin-nano-devkit"\nCHIPID="0x23"\n'
        ti = tarfile.TarInfo("./.env.initrd-flash")
        ti.size = len(env)
        tar.addfile(ti, io.BytesIO(env))
        add(tar)
    return out


def _file(name: str, data: bytes = b"x") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))

    return add


def _special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        ti = tarfile.TarInfo(name)
        ti.type = kind
        ti.linkname = linkname
        if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            ti.devmajor, ti.devminor = 8, 0
        tar.addfile(ti)

    return add


HOSTILE = {
    "dotdot": (_file("../escaped"), "'..'"),
    "nested-dotdot": (_file("./bootloader/../../escaped"), "'..'"),
    "absolute": (_file("/tmp/alma-escaped"), "absolute path"),
    "symlink-escape": (_special("./rootfs-link", tarfile.SYMTYPE, "../../../etc/passwd"), "rootfs-link"),
    "absolute-symlink": (_special("./abs-link", tarfile.SYMTYPE, "/etc/shadow"), "abs-link"),
    "hardlink-escape": (_special("./hl", tarfile.LNKTYPE, "../../etc/passwd"), "hl"),
    "char-device": (_special("./sda", tarfile.CHRTYPE), "device"),
    "block-device": (_special("./nvme0n1", tarfile.BLKTYPE), "device"),
    "fifo": (_special("./pipe", tarfile.FIFOTYPE), "fifo"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused(tmp_path: Path, case: str) -> None:
    add, says = HOSTILE[case]
    b = _hostile(tmp_path, add)
    before = b.read_bytes()
    with pytest.raises(UserError) as ei:
        unpack(b, tmp_path / "work" / "bundle", None)
    assert says in ei.value.message
    assert "refused" in ei.value.message and ei.value.hint
    assert not (tmp_path / "work" / "bundle").exists()
    assert list((tmp_path / "work").iterdir()) == []  # no .extract-* left either
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/alma-escaped").exists()
    assert b.read_bytes() == before


@pytest.mark.parametrize("cut", [0.5, 0.98])
def test_truncated_archive_is_a_clear_error(tmp_path: Path, make_tree: Callable[..., Path], cut: float) -> None:
    whole = tar_gz(make_tree(), tmp_path / "b.tar.gz").read_bytes()
    b = tmp_path / "cut.tar.gz"
    b.write_bytes(whole[: int(len(whole) * cut)])
    with pytest.raises(UserError) as ei:
        bundle.prepare(b, tmp_path / "work", None)
    assert "truncated or corrupt" in ei.value.message
    assert list((tmp_path / "work").iterdir()) == []


def test_corrupt_gzip_data_is_a_clear_error(tmp_path: Path, make_tree: Callable[..., Path]) -> None:
    data = bytearray(tar_gz(make_tree(), tmp_path / "b.tar.gz").read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    b = tmp_path / "bad.tar.gz"
    b.write_bytes(bytes(data))
    with pytest.raises(UserError) as ei:
        bundle.prepare(b, tmp_path / "work", None)
    assert "truncated or corrupt" in ei.value.message
    assert list((tmp_path / "work").iterdir()) == []


def test_not_gzip_at_all(tmp_path: Path) -> None:
    b = tmp_path / "b.tar.gz"
    b.write_bytes(b"PK\x03\x04 this is a zip, not a tar.gz" * 10)
    with pytest.raises(UserError) as ei:
        bundle.prepare(b, tmp_path / "work", None)
    assert "truncated or corrupt" in ei.value.message


def test_bundle_without_env_file_is_not_an_initrd_flash_bundle(tmp_path: Path, make_tree: Callable[..., Path]) -> None:
    tree = make_tree()
    (tree / ".env.initrd-flash").unlink()
    b = tar_gz(tree, tmp_path / "b.tar.gz")
    with pytest.raises(UserError) as ei:
        bundle.prepare(b, tmp_path / "work", None)
    assert "not an initrd-flash bundle" in ei.value.message
    assert not (tmp_path / "work" / "bundle").exists()


def test_missing_bundle_file(tmp_path: Path) -> None:
    with pytest.raises(UserError) as ei:
        bundle.prepare(tmp_path / "nope.tar.gz", tmp_path / "work", None)
    assert "cannot read bundle" in ei.value.message


def test_each_board_gets_its_own_copy_sharing_only_the_payloads(tmp_path: Path, make_tree: Callable[..., Path]) -> None:
    b = tar_gz(make_tree(), tmp_path / "b.tar.gz")
    prepared = bundle.prepare(b, tmp_path / "work", None)
    one, two = tmp_path / "work" / "b1", tmp_path / "work" / "b2"
    how1 = bundle.clone_for_board(prepared, one)
    bundle.clone_for_board(prepared, two)
    assert set(how1) >= {".env.initrd-flash", "initrd-flash", "alma-image.ext4", "bootloader/mb1_t234_prod.bin"}
    if how1["initrd-flash"] != "reflink":  # ext4/tmpfs: no reflinks here
        assert how1["alma-image.ext4"] == "hardlink"
        assert (one / "alma-image.ext4").stat().st_ino == (prepared.root / "alma-image.ext4").stat().st_ino
        assert how1["boot.img"] == "copy"
    # initrd-flash writes into its directory: one board's writes never reach another's
    (one / "flash.xml.in").write_text("changed by board 1")
    (one / "bootloader" / "mb1_t234_prod.bin").write_bytes(b"signed")
    assert (two / "flash.xml.in").read_text() != "changed by board 1"
    assert (prepared.root / "bootloader" / "mb1_t234_prod.bin").read_bytes() != b"signed"
    assert os.access(two / "initrd-flash", os.X_OK)
    assert (two / "alma-image.ext4").read_bytes() == (prepared.root / "alma-image.ext4").read_bytes()
