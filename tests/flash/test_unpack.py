"""The safe unpack (alma.tegraflash.unpack) attacked from its threat model (docs/flash.md):
the real CVE chains against Python's tarfile filter (CVE-2025-4517, -4330, -4138,
CVE-2024-12718), a generated corpus, bombs, sparse members, a filling disk. Every hostile
bundle is generated here; nothing outside the work dir may change, whatever the hash."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alma.errors import Interrupted, UserError
from alma.tegraflash import reader
from alma.tegraflash import unpack as unpack_mod
from alma.tegraflash.unpack import Budget, unpack

ENV = b'MACHINE="jetson-orin-nano-devkit"\nCHIPID="0x23"\nROOTFS_DEVICE="mmcblk0"\n'
Add = Callable[[tarfile.TarFile], None]


class Arc:
    """CPython's ArchiveMaker, in small: add(name, content=, symlink_to=, hardlink_to=, type=)."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.GNU_FORMAT)  # noqa: SIM115 - closed in write()
        self.add(".env.initrd-flash", content=ENV)

    def add(
        self,
        name: str,
        *,
        content: bytes | str | None = None,
        symlink_to: str | None = None,
        hardlink_to: str | None = None,
        type: bytes | None = None,
        mode: int | None = None,
    ) -> None:
        ti = tarfile.TarInfo(name)
        data = content.encode() if isinstance(content, str) else content
        if symlink_to is not None:
            ti.type, ti.linkname = tarfile.SYMTYPE, symlink_to
        elif hardlink_to is not None:
            ti.type, ti.linkname = tarfile.LNKTYPE, hardlink_to
        elif type is not None:
            ti.type = type
        elif name.endswith("/"):
            ti.type = tarfile.DIRTYPE
        if mode is not None:
            ti.mode = mode
        if ti.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            data = data or b""
            ti.size = len(data)
            self.tar.addfile(ti, io.BytesIO(data))
        else:
            self.tar.addfile(ti)

    def write(self, path: Path) -> Path:
        import gzip

        self.tar.close()
        path.write_bytes(gzip.compress(self.buf.getvalue(), 1))
        return path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _snapshot(root: Path, skip: Path) -> dict[str, tuple[int, bytes | str]]:
    out: dict[str, tuple[int, bytes | str]] = {}
    for dirpath, dirs, files in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            dirs[:] = []
            continue
        for n in dirs + files:
            p = Path(dirpath) / n
            st_ = p.lstat()
            body: bytes | str = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else b"")
            out[str(p)] = (st_.st_mode, body)
    return out


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """tmp/outside/flag (what an attack wants to overwrite) beside tmp/work."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "flag").write_text("original")
    (tmp_path / "work").mkdir()
    return tmp_path


def _refused(sandbox: Path, bundle: Path, says: str | None = None) -> UserError:
    before = _snapshot(sandbox, sandbox / "work")
    for expected in (None, _sha(bundle), "0" * 64):  # whatever the hash
        with pytest.raises(UserError) as ei:
            unpack(bundle, sandbox / "work" / "bundle", expected, budget=Budget(margin=0))
        assert ei.value.exit_code == 2 and ei.value.hint
        if says is not None and expected != "0" * 64:
            assert says in ei.value.message, ei.value.message
        assert _snapshot(sandbox, sandbox / "work") == before  # nothing outside changed
        assert list((sandbox / "work").iterdir()) == []  # nothing half-unpacked left
        assert (sandbox / "outside" / "flag").read_text() == "original"
    # verify refuses the same bundle (one checker)
    with pytest.raises(UserError):
        reader.scan(bundle)
    return ei.value


def cve_2025_4517(arc: Arc, dest: Path, outside: Path) -> Arc:
    """CPython's test_realpath_limit_attack chain, aimed from ``dest`` (where the archive is
    unpacked) at ``outside/flag``: symlinks whose expansion overflows PATH_MAX so realpath()
    stops checking, then a hard link through them, then a write through the hard link."""
    steps = "abcdefghijklmnop"
    max_path = os.pathconf(dest.parent if dest.parent.exists() else "/", "PC_PATH_MAX")
    component = "d" * ((max_path - len(str(dest)) - 1) // (len(steps) + 1))
    path = ""
    for i in steps:
        arc.add(os.path.join(path, component), type=tarfile.DIRTYPE, mode=0o777)
        arc.add(os.path.join(path, i), symlink_to=component)
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    arc.add(linkpath, symlink_to=os.path.join(*[".."] * len(steps)))
    arc.add("escape", symlink_to=os.path.join(linkpath, "..", os.path.relpath(outside, dest)))
    arc.add("flaglink", hardlink_to=os.path.join("escape", "flag"))
    arc.add("flaglink", content="overwrite")
    arc.add("escape/newfile", content="new")
    return arc


def test_cve_2025_4517_realpath_limit_chain(sandbox: Path) -> None:
    dest = sandbox / "work" / ".extract-xxxxxxxx"
    arc = cve_2025_4517(Arc(), dest, sandbox / "outside")
    _refused(sandbox, arc.write(sandbox / "cve-2025-4517.tar.gz"), "which the archive made a symlink")


def test_cve_2025_4330_sneaky_hardlink_fallback(sandbox: Path) -> None:
    arc = Arc()
    arc.add("a/t/dummy")
    arc.add("b/")
    arc.add("c", symlink_to=os.path.join("a", "t"))
    arc.add("c/escape", symlink_to=os.path.join("..", "..", "link_here"))
    arc.add("c", symlink_to="b")
    arc.add("boom", hardlink_to=os.path.join("c", "escape"))
    _refused(sandbox, arc.write(sandbox / "cve-2025-4330.tar.gz"), "lies under 'c'")


def test_cve_2025_4138_exfiltration_via_symlink(sandbox: Path) -> None:
    """A symlink that resolves out only through another of the archive's own links, then a
    hard link through it to a file outside (to read or overwrite it)."""
    arc = Arc()
    arc.add("link", symlink_to="./")
    arc.add("exfil", symlink_to="link/link/../../outside/flag")
    arc.add("leak", hardlink_to="exfil")
    _refused(sandbox, arc.write(sandbox / "cve-2025-4138.tar.gz"), "not a regular file earlier")
    arc = Arc()
    arc.add("link", symlink_to="./")
    arc.add("exfil", symlink_to="link/link/../../outside/flag")
    _refused(sandbox, arc.write(sandbox / "cve-2025-4138b.tar.gz"), "points outside the bundle")


def test_cve_2024_12718_metadata_through_a_link(sandbox: Path) -> None:
    """A link to outside, then a member of the same name whose mode/mtime would be applied
    through it (chmod 0o777 on the target)."""
    arc = Arc()
    arc.add("meta", symlink_to="../../outside/flag")
    arc.add("meta", type=tarfile.DIRTYPE, mode=0o7777)
    _refused(sandbox, arc.write(sandbox / "cve-2024-12718.tar.gz"), "duplicates an earlier symlink")
    assert (sandbox / "outside" / "flag").stat().st_mode & 0o777 != 0o777


def _one(add: Callable[[Arc], None]) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        arc = Arc()
        add(arc)
        return arc.write(path)

    return make


HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "absolute": (_one(lambda a: a.add("/tmp/alma-escaped", content="x")), "absolute path"),
    "dotdot": (_one(lambda a: a.add("../escaped", content="x")), "'..'"),
    "nested-dotdot": (_one(lambda a: a.add("bootloader/../../escaped", content="x")), "'..'"),
    "abs-symlink": (_one(lambda a: a.add("l", symlink_to="/etc/shadow")), "absolute"),
    "symlink-out": (_one(lambda a: a.add("l", symlink_to="../../outside")), "points outside"),
    "abs-hardlink": (_one(lambda a: a.add("h", hardlink_to="/etc/passwd")), "absolute"),
    "hardlink-out": (_one(lambda a: a.add("h", hardlink_to="../outside/flag")), "'..'"),
    "link-to-link": (
        _one(lambda a: (a.add("f", content="x"), a.add("h1", hardlink_to="f"), a.add("h2", hardlink_to="h1"))),
        "not a regular file earlier",
    ),
    "hardlink-to-symlink": (
        _one(lambda a: (a.add("s", symlink_to="."), a.add("h", hardlink_to="s"))),
        "not a regular file earlier",
    ),
    "write-through-link": (
        _one(lambda a: (a.add("d/"), a.add("x", symlink_to="d"), a.add("x/f", content="through"))),
        "which the archive made a symlink",
    ),
    "write-under-file": (_one(lambda a: (a.add("f", content="x"), a.add("f/g", content="y"))), "made a file"),
    "symlink-loop": (_one(lambda a: (a.add("a", symlink_to="b"), a.add("b", symlink_to="a"))), "links in a chain"),
    "overlong-path": (_one(lambda a: a.add("/".join(["p" * 200] * 25), content="x")), "longer than 4095"),
    "overlong-component": (_one(lambda a: a.add("n" * 300, content="x")), "longer than 255"),
    "char-device": (_one(lambda a: a.add("sda", type=tarfile.CHRTYPE)), "device or fifo"),
    "block-device": (_one(lambda a: a.add("nvme0n1", type=tarfile.BLKTYPE)), "device or fifo"),
    "fifo": (_one(lambda a: a.add("pipe", type=tarfile.FIFOTYPE)), "device or fifo"),
    "duplicate": (_one(lambda a: (a.add("f", content="1"), a.add("f", content="2"))), "duplicates an earlier file"),
    "replaces-dir": (_one(lambda a: (a.add("d/"), a.add("d", content="x"))), "replaces the directory"),
    "replaces-root": (_one(lambda a: a.add(".", content="x")), "unpack directory itself"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundles_are_refused_and_nothing_escapes(sandbox: Path, case: str) -> None:
    make, says = HOSTILE[case]
    _refused(sandbox, make(sandbox / f"{case}.tar.gz"), says)


def test_setuid_bits_are_stripped_and_inside_links_kept(sandbox: Path) -> None:
    arc = Arc()
    arc.add("initrd-flash", content="#!/bin/sh\n", mode=0o6777)
    arc.add("bootloader/", mode=0o1777)
    arc.add("bootloader/mb1.bin", content="x")
    arc.add("mb1-link", symlink_to="bootloader/mb1.bin")
    arc.add("same", hardlink_to="bootloader/mb1.bin")
    b = arc.write(sandbox / "ok.tar.gz")
    u = unpack(b, sandbox / "work" / "bundle", _sha(b), budget=Budget(margin=0))
    assert (u.root / "initrd-flash").stat().st_mode & 0o7777 == 0o755
    assert (u.root / "bootloader").stat().st_mode & 0o7777 == 0o755
    assert os.readlink(u.root / "mb1-link") == "bootloader/mb1.bin"
    assert (u.root / "same").stat().st_ino == (u.root / "bootloader" / "mb1.bin").stat().st_ino


def test_hash_mismatch_creates_no_links_and_leaves_nothing(sandbox: Path) -> None:
    arc = Arc()
    arc.add("f", content="x")
    arc.add("l", symlink_to="f")
    b = arc.write(sandbox / "b.tar.gz")
    with pytest.raises(UserError, match="sha256 mismatch"):
        unpack(b, sandbox / "work" / "bundle", "1" * 64, budget=Budget(margin=0))
    assert list((sandbox / "work").iterdir()) == []


# -- bounded inflation -------------------------------------------------------------------


def _bomb(path: Path, declared: int, real: int = 1 << 20) -> Path:
    """A tar.gz whose member claims ``declared`` bytes of zeros (20 GiB in ~20 MB of gzip
    would be the real thing; the claim alone must be enough to refuse it)."""
    import gzip

    ti = tarfile.TarInfo("alma-image.ext4")
    ti.size = declared
    head = io.BytesIO()
    with tarfile.open(fileobj=head, mode="w", format=tarfile.GNU_FORMAT) as t:
        e = tarfile.TarInfo(".env.initrd-flash")
        e.size = len(ENV)
        t.addfile(e, io.BytesIO(ENV))
    raw = head.getvalue()[: -2 * 512 - (len(head.getvalue()) % 10240 and 0)]
    raw = raw.rstrip(b"\0")
    raw += b"\0" * (-len(raw) % 512)
    raw += ti.tobuf(tarfile.GNU_FORMAT) + b"\0" * real
    path.write_bytes(gzip.compress(raw, 1))
    return path


def test_a_bomb_is_refused_within_seconds_and_no_large_file_left(sandbox: Path) -> None:
    b = _bomb(sandbox / "bomb.tar.gz", 20 << 30)
    t0 = time.monotonic()
    with pytest.raises(UserError) as ei:
        unpack(b, sandbox / "work" / "bundle", None, budget=Budget(margin=1 << 30, free=lambda p: 8 << 30))
    assert time.monotonic() - t0 < 60  # refused up front; unpacking 20 GB would take far longer
    assert "needs 21.5 GB, 8.6 GB free" in ei.value.message and "--work-dir" in str(ei.value.hint)
    assert list((sandbox / "work").iterdir()) == []


def test_the_cap_refuses_what_free_space_would_allow(sandbox: Path) -> None:
    b = _bomb(sandbox / "bomb.tar.gz", 3 << 30)
    with pytest.raises(UserError) as ei:
        unpack(b, sandbox / "work" / "bundle", None, budget=Budget(cap=2 * 10**9, margin=0, free=lambda p: 1 << 40))
    assert "needs 3.2 GB, more than the unpack cap of 2.0 GB" in ei.value.message


def test_sparse_60_gb_image_with_little_data_is_normal_and_keeps_its_holes(sandbox: Path) -> None:
    tree = sandbox / "tree"
    tree.mkdir()
    (tree / ".env.initrd-flash").write_bytes(ENV)
    img = tree / "alma-image.ext4"
    with open(img, "wb") as fh:
        fh.truncate(60 * 10**9)
        fh.seek(30 * 10**9)
        fh.write(os.urandom(1 << 20))
    b = sandbox / "sparse.tar.gz"
    subprocess.run(["tar", "--sparse", "-czf", str(b), "-C", str(tree), "."], check=True)
    # 1 GB of budget is plenty for 1 MiB of data, though the file is 60 GB long
    u = unpack(b, sandbox / "work" / "bundle", _sha(b), budget=Budget(margin=0, free=lambda p: 10**9))
    out = u.root / "alma-image.ext4"
    assert out.stat().st_size == 60 * 10**9
    assert out.stat().st_blocks * 512 < 16 << 20
    assert u.data_bytes < 2 << 20


def test_a_disk_filling_up_while_writing_is_refused_and_cleaned(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unpack_mod, "RECHECK_EVERY", 64 << 10)
    tree = sandbox / "tree"
    tree.mkdir()
    (tree / ".env.initrd-flash").write_bytes(ENV)
    (tree / "alma-image.ext4").write_bytes(os.urandom(4 << 20))
    b = sandbox / "b.tar.gz"
    subprocess.run(["tar", "-czf", str(b), "-C", str(tree), "."], check=True)
    calls = iter([10**12] + [1] * 1000)  # plenty at the start, then someone fills the disk
    with pytest.raises(UserError) as ei:
        unpack(b, sandbox / "work" / "bundle", None, budget=Budget(margin=1 << 20, free=lambda p: next(calls)))
    assert "the disk is filling up" in ei.value.message
    assert list((sandbox / "work").iterdir()) == []


def test_enospc_is_a_clear_refusal(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if len(data) > 1000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    tree = sandbox / "tree"
    tree.mkdir()
    (tree / ".env.initrd-flash").write_bytes(ENV)
    (tree / "big").write_bytes(os.urandom(1 << 20))
    b = sandbox / "b.tar.gz"
    subprocess.run(["tar", "-czf", str(b), "-C", str(tree), "."], check=True)
    monkeypatch.setattr(unpack_mod.os, "write", full)
    with pytest.raises(UserError) as ei:
        unpack(b, sandbox / "work" / "bundle", None, budget=Budget(margin=0))
    assert "needs" in ei.value.message and "GB free" in ei.value.message
    monkeypatch.undo()
    assert list((sandbox / "work").iterdir()) == []


def test_cancel_stops_the_unpack_and_leaves_nothing(sandbox: Path) -> None:
    tree = sandbox / "tree"
    tree.mkdir()
    (tree / ".env.initrd-flash").write_bytes(ENV)
    (tree / "big").write_bytes(os.urandom(8 << 20))
    b = sandbox / "b.tar.gz"
    subprocess.run(["tar", "-czf", str(b), "-C", str(tree), "."], check=True)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Interrupted):
        unpack(b, sandbox / "work" / "bundle", None, budget=Budget(margin=0), cancel=cancel)
    assert list((sandbox / "work").iterdir()) == []


# -- a generated corpus ------------------------------------------------------------------

NAMES = ["a", "b", "a/b", "a/b/c", "c", "./a", "../x", "/abs", "a/../..", "d/e", "l", "l/f", ".", "a/./b"]
TARGETS = ["a", "b", "a/b", ".", "..", "../..", "/etc/passwd", "a/../..", "l", "l/..", "x/../../outside", "c/d"]
KINDS = ["file", "dir", "symlink", "hardlink", "fifo"]

member = st.tuples(st.sampled_from(KINDS), st.sampled_from(NAMES), st.sampled_from(TARGETS))


def build(members: list[tuple[str, str, str]], path: Path) -> Path:
    arc = Arc()
    for kind, name, target in members:
        if kind == "file":
            arc.add(name, content=b"data")
        elif kind == "dir":
            arc.add(name, type=tarfile.DIRTYPE)
        elif kind == "symlink":
            arc.add(name, symlink_to=target)
        elif kind == "hardlink":
            arc.add(name, hardlink_to=target)
        else:
            arc.add(name, type=tarfile.FIFOTYPE)
    return arc.write(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(member, min_size=1, max_size=8))
def test_generated_bundles_never_write_outside_and_leave_only_inside_links(
    tmp_path_factory: pytest.TempPathFactory, members: list[tuple[str, str, str]]
) -> None:
    base = tmp_path_factory.mktemp("corpus")
    (base / "outside").mkdir()
    (base / "outside" / "flag").write_text("original")
    work = base / "deep" / "er" / "work"  # room for ../.. to land inside base
    work.mkdir(parents=True)
    b = build(members, base / "g.tar.gz")
    before = _snapshot(base, work)
    try:
        u = unpack(b, work / "bundle", None, budget=Budget(margin=0))
    except UserError:
        assert list(work.iterdir()) == []
    else:
        root = u.root.resolve()
        for p in u.root.rglob("*"):
            if p.is_symlink():
                assert Path(os.path.realpath(p)).is_relative_to(root), (p, os.readlink(p))
    assert _snapshot(base, work) == before


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "inline"])
def test_members_ending_on_block_and_piece_boundaries(sandbox: Path, threaded: bool) -> None:
    """tarfile peeks one byte back after each member: members of exactly 512 bytes and of
    exactly one inflate step (4 MiB) end where a piece ends, so the peek crosses pieces."""
    arc = Arc()
    sizes = {"block": 512, "step": 4 << 20, "step2": 8 << 20, "odd": 4097}
    for name, n in sizes.items():
        arc.add(name, content=os.urandom(n))
    b = arc.write(sandbox / "b.tar.gz")
    u = unpack(b, sandbox / "work" / "bundle", _sha(b), budget=Budget(margin=0), threaded=threaded)
    assert {n: (u.root / n).stat().st_size for n in sizes} == sizes
    assert reader.scan(b).sha256 == u.sha256


def test_bundle_names() -> None:
    from alma.tegraflash.names import link_name, parse_name

    n = parse_name("alma-image-jetson-orin-nano-devkit.rootfs-20261130120000.tegraflash.tar.gz")
    assert n is not None and n.stamp == "20261130120000" and n.fmt == "tar.gz"
    assert n.is_for("alma-image", "jetson-orin-nano-devkit") and not n.is_for("alma-image", "jetson-agx-orin-devkit")
    assert parse_name(link_name("alma-image", "jetson-agx-orin-devkit", "zip")) is not None
    assert parse_name("evil.tar.gz") is None
