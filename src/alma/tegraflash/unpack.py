"""The safe unpack: independent of the interpreter's tar filter, nothing the archive created
is ever followed, inflation bounded, nothing promoted before the hash matched.

Invariants (tests/flash/test_unpack.py attacks each):

1. Nothing is written outside the private ``.extract-*`` directory, whatever the archive.
   Every member passes :class:`~alma.tegraflash.members.MemberChecker` (no absolute or
   ``..`` names, nothing under a non-directory, no devices, no duplicates). Regular files
   and directories are created first, each path component opened relative to the previous
   one's fd with ``O_NOFOLLOW`` (files ``O_CREAT|O_EXCL|O_NOFOLLOW``), so even a link that
   appeared behind our back is never followed. Hard links, then symlinks, are created
   last, after the hash matched, each checked against the final tree; directory modes are
   applied after that (GNU tar's delayed directory restore).
2. Inflation is bounded: a member's stored data (sparse members: their data, holes stay
   holes) must fit in min(free space - margin, cap) before a byte of it is written, and
   free space is checked again while writing; ENOSPC is the same clear refusal.
3. ``dest`` appears (one rename) only once the archive ended cleanly, its gzip trailer
   checked, and the sha256 of the whole file matched. On any failure or interruption the
   private directory is removed: nothing half-unpacked is left.
4. Modes: no setuid/setgid/sticky, no group/other write; owners are never applied.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.errors import Interrupted, UserError
from alma.ground import open_regular
from alma.tegraflash import names
from alma.tegraflash.envfile import ENV_NAME, FlashEnv
from alma.tegraflash.members import DIR, FILE, HARDLINK, SYMLINK, Member, MemberChecker, UnsafeBundle
from alma.tegraflash.reader import read_env_member, walk
from alma.tegraflash.stream import CHUNK, BundleStream, CorruptBundle, Progress

GB = 1e9
DEFAULT_MARGIN = 1 << 30  # free space always left on the work dir's filesystem
RECHECK_EVERY = 256 << 20  # bytes written between free-space checks
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass
class Budget:
    """How much an unpack may write: min(free - margin, cap). ``free`` is injectable."""

    cap: int | None = None
    margin: int = DEFAULT_MARGIN
    free: Callable[[Path], int] = free_bytes


class NoSpace(UserError):
    def __init__(self, needs: int, free: int, where: Path, budget: Budget, what: str) -> None:
        capped = budget.cap is not None and needs > budget.cap
        limit = (
            f"more than the unpack cap of {budget.cap / GB:.1f} GB (alma flash --unpack-cap GB)"
            if capped and budget.cap is not None
            else f"{free / GB:.1f} GB free in {where} (less a {budget.margin / GB:.1f} GB margin)"
        )
        super().__init__(
            f"{what}: needs {needs / GB:.1f} GB, {limit}; refused (nothing was flashed)",
            hint="free space there or choose another place: alma flash --work-dir DIR"
            + ("; or raise --unpack-cap if the bundle is genuine" if capped else ""),
        )


@dataclass
class Unpacked:
    root: Path
    sha256: str
    members: int
    data_bytes: int
    env: FlashEnv
    # sha256 of members' bytes as the archive carried them (HASHED_MEMBERS): what runs is checked against it
    member_sha256: dict[str, str] = field(default_factory=dict)


HASHED_MEMBERS = ("initrd-flash",)


@dataclass
class _State:
    allowed: int
    written: int = 0
    next_check: int = RECHECK_EVERY
    dirs: list[Member] = field(default_factory=list)
    links: list[Member] = field(default_factory=list)
    count: int = 0
    hashes: dict[str, str] = field(default_factory=dict)


def _open_dir(rootfd: int, parts: list[str], create: bool) -> int:
    """An fd of root/parts..., each component opened without following links."""
    fd = os.dup(rootfd)
    try:
        for p in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(p, 0o700, dir_fd=fd)
            nfd = os.open(p, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Unpacker:
    def __init__(self, bundle: Path, tmp: Path, rootfd: int, budget: Budget, stream: BundleStream) -> None:
        self.bundle = bundle
        self.tmp = tmp
        self.rootfd = rootfd
        self.budget = budget
        self.stream = stream
        free = budget.free(tmp)
        allowed = free - budget.margin
        if budget.cap is not None:
            allowed = min(allowed, budget.cap)
        self.free0 = free
        self.state = _State(allowed=max(0, allowed), next_check=RECHECK_EVERY)

    def _refuse_space(self, needs: int, what: str) -> NoSpace:
        return NoSpace(needs, self.budget.free(self.tmp), self.tmp.parent, self.budget, f"{self.bundle.name}: {what}")

    def file(self, m: Member, data: bytes | None) -> None:
        st = self.state
        if st.written + m.data_size > st.allowed:
            raise self._refuse_space(st.written + m.data_size, f"unpacking {m.name!r}")
        pfd = _open_dir(self.rootfd, m.parts[:-1], create=True)
        try:
            fd = os.open(m.parts[-1], _FILE_FLAGS, 0o600, dir_fd=pfd)
        finally:
            os.close(pfd)
        h = hashlib.sha256() if m.name in HASHED_MEMBERS else None
        try:
            if data is not None:
                _write_all(fd, data)
                st.written += len(data)
                if h is not None:
                    h.update(data)
            else:
                self._copy_data(fd, m, h)
            if h is not None:
                st.hashes[m.name] = h.hexdigest()
            if m.sparse:
                os.ftruncate(fd, m.size)  # a trailing hole
            os.fchmod(fd, m.mode)
            os.utime(fd, ns=(m.mtime * 1_000_000_000, m.mtime * 1_000_000_000))
        finally:
            os.close(fd)

    def _copy_data(self, fd: int, m: Member, h: Any = None) -> None:
        st = self.state
        self.stream.seek(m.offset_data)
        for off, n in m.sparse or [(0, m.size)]:
            if m.sparse:
                os.lseek(fd, off, os.SEEK_SET)
            left = n
            while left:
                piece = self.stream.read_piece(min(left, 4 * CHUNK))
                if not piece:
                    raise CorruptBundle(f"member {m.name!r} ends early")
                _write_all(fd, piece)
                if h is not None:
                    h.update(piece)
                left -= len(piece)
                st.written += len(piece)
                if st.written >= st.next_check:
                    st.next_check = st.written + RECHECK_EVERY  # module global: tests shrink it
                    if self.budget.free(self.tmp) < self.budget.margin:
                        raise self._refuse_space(st.written + left, f"unpacking {m.name!r} (the disk is filling up)")

    def directory(self, m: Member) -> None:
        os.close(_open_dir(self.rootfd, m.parts, create=True))
        self.state.dirs.append(m)

    def finish_links(self) -> None:
        """Hard links, then symlinks, then directory modes: after the hash matched."""
        for m in self.state.links:
            if m.kind != HARDLINK:
                continue
            tparts = m.linkname.split("/")
            sfd = _open_dir(self.rootfd, tparts[:-1], create=False)
            dfd = _open_dir(self.rootfd, m.parts[:-1], create=True)
            try:
                os.link(tparts[-1], m.parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(sfd)
                os.close(dfd)
        for m in self.state.links:
            if m.kind != SYMLINK:
                continue
            dfd = _open_dir(self.rootfd, m.parts[:-1], create=True)
            try:
                os.symlink(m.linkname, m.parts[-1], dir_fd=dfd)
            finally:
                os.close(dfd)
        for m in sorted(self.state.dirs, key=lambda d: -len(d.parts)):
            fd = _open_dir(self.rootfd, m.parts, create=False)
            try:
                os.fchmod(fd, m.mode)
            finally:
                os.close(fd)


def unpack(
    bundle: Path,
    dest: Path,
    expected_sha256: str | None,
    *,
    budget: Budget | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    threaded: bool = True,
) -> Unpacked:
    """Unpack ``bundle`` (tar.gz) into the new directory ``dest``, hashing while inflating.

    On any problem ``dest`` does not exist afterwards and nothing else was written.
    """
    bundle, dest = Path(bundle), Path(dest)
    budget = budget or Budget()
    if names.is_zip(bundle.name):
        raise UserError(f"{bundle.name}: {names.ZIP_REFUSAL}", hint=names.ZIP_HINT)
    try:
        raw = os.fdopen(open_regular(bundle), "rb", buffering=0)  # a FIFO/device never blocks; closed below
    except OSError as exc:
        raise UserError(
            f"cannot read bundle {bundle}: {exc.strerror}", hint="check the path (alma verify prints it)"
        ) from exc
    total = os.fstat(raw.fileno()).st_size
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))  # mode 0700
    rootfd = os.open(tmp, _DIR_FLAGS)
    stream = BundleStream(raw, total, progress, threaded=threaded, cancel=cancel)
    checker = MemberChecker()
    try:
        u = _Unpacker(bundle, tmp, rootfd, budget, stream)
        env: FlashEnv | None = None
        for tar, ti, m in walk(stream, checker):
            if cancel is not None and cancel.is_set():  # per member too: a flood of tiny members
                raise Interrupted("interrupted while unpacking the bundle; nothing was flashed")
            u.state.count += 1
            if m.name == ENV_NAME:
                env, data = read_env_member(tar, ti, m, bundle.name)
                u.file(m, data)
            elif m.kind == FILE:
                u.file(m, None)
            elif m.kind == DIR:
                u.directory(m)
            else:
                u.state.links.append(m)
        stream.finish()
        stream.drain()
        digest = stream.sha256()
        if expected_sha256 and digest != expected_sha256.lower():
            raise UserError(
                f"{bundle.name}: sha256 mismatch: the facts manifest expects {expected_sha256}, the file is "
                f"{digest}; refused to unpack it",
                hint="the bundle changed since `alma verify` recorded it: re-run alma verify on the build host, "
                "or copy the right bundle",
            )
        if env is None:
            raise UserError(
                f"the bundle has no {ENV_NAME}: not an initrd-flash bundle",
                hint="build it with meta-tegra scarthgap (Orin bundles carry initrd-flash); doflash.sh bundles "
                "are not supported by alma flash",
            )
        u.finish_links()
        os.replace(tmp, dest)
        env.path = dest / ENV_NAME
        return Unpacked(dest, digest, u.state.count, u.state.written, env, dict(u.state.hashes))
    except (UnsafeBundle, CorruptBundle) as exc:
        exc.message = f"{bundle.name}: {exc.message}"
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(
                checker.data_total, budget.free(dest.parent), dest.parent, budget, f"{bundle.name}: unpacking"
            ) from exc
        if exc.errno is not None:
            raise UserError(f"cannot unpack {bundle.name}: {exc}", hint="check the work directory") from exc
        raise CorruptBundle(str(exc)) from exc
    finally:
        stream.close()
        raw.close()
        os.close(rootfd)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
