"""`alma verify` and `alma flash` read a bundle through one reader (alma.tegraflash): over
generated member lists, names, links and env files, a bundle one accepts the other accepts."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alma.errors import UserError
from alma.tegraflash import reader
from alma.tegraflash.unpack import Budget, unpack

NAMES = ["a", "a/b", "b", "./c", "../x", "/abs", "d/../..", "l", "l/f", "n" * 300, "."]
TARGETS = ["a", "a/b", ".", "..", "/etc/passwd", "l", "l/..", "x/../..", "c"]
ENVS = [
    'MACHINE="jetson-orin-nano-devkit"\nROOTFS_DEVICE="mmcblk0"\n',
    'MACHINE="x"\nDEFAULTS[BOARDID]="3767"\nEVIL="$(touch /tmp/alma-pwned)"\n',
    "echo not an assignment\n",
    'MACHINE="unterminated\n',
    "MACHINE=\n",
]
member = st.tuples(
    st.sampled_from(["file", "dir", "symlink", "hardlink", "fifo"]), st.sampled_from(NAMES), st.sampled_from(TARGETS)
)


def _tar(env: str | None, members: list[tuple[str, str, str]], path: Path) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        if env is not None:
            ti = tarfile.TarInfo(".env.initrd-flash")
            ti.size = len(env.encode())
            tar.addfile(ti, io.BytesIO(env.encode()))
        for kind, name, target in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size = 3
                tar.addfile(ti, io.BytesIO(b"abc"))
                continue
            ti.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}.get(
                kind, tarfile.FIFOTYPE
            )
            ti.linkname = target if kind in ("symlink", "hardlink") else ""
            tar.addfile(ti)
    path.write_bytes(buf.getvalue())
    return path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.none(), st.sampled_from(ENVS)), st.lists(member, max_size=6))
def test_verify_and_flash_accept_the_same_bundles(
    tmp_path_factory: pytest.TempPathFactory, env: str | None, members: list[tuple[str, str, str]]
) -> None:
    base = tmp_path_factory.mktemp("agree")
    b = _tar(env, members, base / "b.tegraflash.tar.gz")
    try:
        scan = reader.scan(b)
        verify_ok = scan.env is not None  # verify reports a bundle without env file as a problem
    except UserError:
        verify_ok = False
    try:
        u = unpack(b, base / "work" / "bundle", None, budget=Budget(margin=0))
        flash_ok = True
        assert u.sha256 == scan.sha256 and u.env.flat() == scan.env
    except UserError:
        flash_ok = False
    assert verify_ok == flash_ok, (env, members)


def _raw_parts() -> list[bytes]:
    from flash import hostile_tar as H

    return [
        H.member(b"ok", b"abc"),
        H.header(b"dir", 0, b"5"),
        H.header(b"bad-sum", 1, checksum_delta=3) + H.pad(b"x"),
        H.old_gnu_sparse(b"sp", [(0, 4), (100, 4)], 200) + H.pad(b"abcdefgh"),
        H.old_gnu_sparse(b"sp-big-map", [(0, 1 << 20)], 1 << 20, stored=4) + H.pad(b"abcd"),
        H.old_gnu_sparse(b"sp-past-end", [(0, 4), (300, 4)], 200) + H.pad(b"abcdefgh"),
        H.pax(H.pax_record(b"path", b"pax-name")) + H.member(b"short", b"1"),
        H.pax(b"0" * 3000 + b"1 hdrcharset=" * 50),
        H.pax(H.pax_record(b"GNU.sparse.size", b"8") + H.pax_record(b"GNU.sparse.map", b"0,4"))
        + H.member(b"s01", b"abcd"),
        H.pax(H.pax_record(b"GNU.sparse.size", b"8") + H.pax_record(b"GNU.sparse.map", b"0,z"))
        + H.member(b"s01x", b"abcd"),
        H.header(b"././@LongLink", 10, b"L") + H.pad(b"long-name\0"),  # a long name for whatever follows
        H.header(b"n", 5, size_field=b"12z45678901\0") + H.pad(b"12345"),
        H.header(b"hl", 0, b"1", linkname=b"ok"),
        H.header(b"fifo", 0, b"6"),
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=0, max_value=13), max_size=5), st.booleans())
def test_verify_and_flash_agree_on_hostile_headers(
    tmp_path_factory: pytest.TempPathFactory, picks: list[int], cut: bool
) -> None:
    """The issue-18 kinds mixed with good members: sparse maps that do not add up, bad
    checksums mid-archive, ReDoS-shaped pax headers, bad numbers, a truncated end."""
    from flash import hostile_tar as H

    parts = _raw_parts()
    tar = H.bundle(*(parts[i] for i in picks))
    if cut:
        tar = tar[: -len(H.END)]
    base = tmp_path_factory.mktemp("agree-raw")
    b = base / "b.tegraflash.tar.gz"
    b.write_bytes(H.gz(tar))
    try:
        scan = reader.scan(b)
        verify_ok = scan.env is not None
    except UserError:
        verify_ok = False
    try:
        u = unpack(b, base / "work" / "bundle", None, budget=Budget(margin=0))
        flash_ok = True
        assert u.sha256 == scan.sha256
    except UserError:
        flash_ok = False
    assert verify_ok == flash_ok, picks
    if flash_ok:
        assert not cut  # an archive without its end blocks is never accepted
