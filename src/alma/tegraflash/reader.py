"""Walk a bundle's members through the one stream and the one checker; ``scan`` for verify.

``walk`` is the only place that turns tar headers into checked members: ``scan`` (``alma
verify``: nothing written) and ``unpack`` (``alma flash``) both iterate it, so a bundle one
accepts the other accepts (tests/artefacts/test_bundle_agreement.py proves it with
hypothesis). ``TEGRAFLASH_PACKAGE_FORMAT = "zip"`` bundles are hashed in one pass and
their names checked through the same checker (verify only: initrd-flash bundles are tar).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.errors import UserError
from alma.ground import open_regular
from alma.tegraflash import names
from alma.tegraflash.envfile import ENV_MAX, ENV_NAME, FlashEnv, decode_env
from alma.tegraflash.headers import headers
from alma.tegraflash.members import FILE, Member, MemberChecker, UnsafeBundle
from alma.tegraflash.stream import CHUNK, BundleStream, CorruptBundle, Progress

# Members whose presence verify checks (besides ROOTFS_IMAGE named in the env file).
REQUIRED_MEMBERS = (ENV_NAME, "initrd-flash", "flash.xml.in")
READER = "tegraflash/3"  # bumps invalidate verify's cached scans of older readers


def walk(stream: BundleStream, checker: MemberChecker) -> Iterator[tuple[BundleStream, tarfile.TarInfo, Member]]:
    """Checked members in archive order; ``checker.finish()`` has run when it ends.

    Headers are parsed by our own reader (:mod:`.headers`: bounded work on every Python),
    never by ``tarfile``'s; a malformed header anywhere is a CorruptBundle (exit 2).
    """
    for ti in headers(stream):
        m = checker.check(ti)
        if m is not None:
            yield stream, ti, m
    checker.finish()


def read_env_member(stream: BundleStream, ti: tarfile.TarInfo, m: Member, where: str) -> tuple[FlashEnv, bytes]:
    if m.kind != FILE or m.size > ENV_MAX or m.sparse:
        raise UnsafeBundle(f"{ENV_NAME} is not a small regular file")
    stream.seek(m.offset_data)
    data = stream.read(m.size)  # into memory only
    if len(data) != m.size:
        raise CorruptBundle(f"{ENV_NAME} ends early")
    return decode_env(data, f"{where}:{ENV_NAME}"), data


@dataclass
class BundleScan:
    sha256: str
    size: int
    env: dict[str, str] | None  # parsed .env.initrd-flash (KEY and DEFAULTS[KEY]), None when absent
    members: list[str] = field(default_factory=list)  # the checked members that were found
    complete: bool = False  # True when the tar and its gzip trailer were read to the end
    data_bytes: int = 0  # what an unpack writes (sparse members by their data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reader": READER,
            "sha256": self.sha256,
            "size": self.size,
            "env": self.env,
            "members": self.members,
            "complete": self.complete,
            "data_bytes": self.data_bytes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BundleScan:
        if d.get("reader") != READER:
            raise KeyError("scanned by another reader")
        return cls(
            d["sha256"],
            int(d["size"]),
            d.get("env"),
            list(d.get("members", [])),
            bool(d.get("complete")),
            int(d.get("data_bytes", 0)),
        )


def scan(path: Path, progress: Progress | None = None) -> BundleScan:
    """sha256 + env + checked members of a ``.tegraflash.tar.gz`` or ``.tegraflash.zip``.

    Raises UnsafeBundle / CorruptBundle / UserError (exit 2) for what flash would refuse.
    """
    fd = open_regular(path)  # a FIFO or device never blocks, never reads as a bundle
    size = os.fstat(fd).st_size
    if names.is_zip(path.name):
        os.close(fd)
        return _scan_zip(path, size, progress)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        stream = BundleStream(fh, size, progress)
        env: FlashEnv | None = None
        seen: set[str] = set()
        checker = MemberChecker()
        for tar, ti, m in walk(stream, checker):
            seen.add(m.name)
            if m.name == ENV_NAME:
                env, _ = read_env_member(tar, ti, m, path.name)
        # to the gzip trailer: its CRC and length prove the bundle is whole
        stream.finish()
        stream.drain()
    wanted = set(REQUIRED_MEMBERS)
    if env is not None and env.get("ROOTFS_IMAGE"):
        wanted.add(env.get("ROOTFS_IMAGE"))
    return BundleScan(
        stream.sha256(), size, env.flat() if env else None, sorted(wanted & seen), True, checker.data_total
    )


def _zip_info(zi: zipfile.ZipInfo) -> tarfile.TarInfo:
    """The zip entry as the tar member the checker judges (same rules, same messages)."""
    ti = tarfile.TarInfo(zi.filename)
    mode = zi.external_attr >> 16
    kind = stat.S_IFMT(mode)  # 0 when the zip tool stored permissions only
    if zi.is_dir():
        ti.type = tarfile.DIRTYPE
    elif kind == stat.S_IFLNK:
        ti.type = tarfile.SYMTYPE
        ti.linkname = "/"  # the target is the entry's data; never followed: refused like an absolute link
    elif kind and kind != stat.S_IFREG:
        ti.type = tarfile.FIFOTYPE if stat.S_ISFIFO(mode) else tarfile.CHRTYPE
    ti.size = zi.file_size
    ti.mode = stat.S_IMODE(mode) or 0o644
    return ti


def _scan_zip(path: Path, size: int, progress: Progress | None) -> BundleScan:
    h = hashlib.sha256()
    done = 0
    with path.open("rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, size)
    checker = MemberChecker()
    env: FlashEnv | None = None
    found: set[str] = set()
    try:
        with zipfile.ZipFile(path) as zf:  # reads only the central directory + one member
            for zi in zf.infolist():
                m = checker.check(_zip_info(zi))
                if m is None:
                    continue
                found.add(m.name)
                if m.name == ENV_NAME:
                    if m.kind != FILE or m.size > ENV_MAX:
                        raise UnsafeBundle(f"{ENV_NAME} is not a small regular file")
                    env = decode_env(zf.read(zi), f"{path.name}:{ENV_NAME}")
            checker.finish()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise UserError(f"{path}: not a readable zip bundle ({exc})", hint="rebuild the image") from exc
    wanted = set(REQUIRED_MEMBERS) | ({env.get("ROOTFS_IMAGE")} if env and env.get("ROOTFS_IMAGE") else set())
    return BundleScan(
        h.hexdigest(), size, env.flat() if env else None, sorted(wanted & found), True, checker.data_total
    )
