"""Prepare a bundle for flashing: the safe one-pass unpack (alma.tegraflash.unpack), then
one private copy per board (initrd-flash writes into its own directory).

The unpacked tree only becomes ``<work>/bundle`` after the archive ended cleanly *and*
the hash matched (see alma.tegraflash.unpack for the invariants). The bundle file is only read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from alma.errors import UserError
from alma.tegraflash.envfile import FlashEnv
from alma.tegraflash.stream import Progress
from alma.tegraflash.unpack import GB, Budget, unpack

FICLONE = 0x40049409  # linux/fs.h: reflink a whole file (btrfs, xfs, bcachefs)


@dataclass
class PreparedBundle:
    source: Path
    root: Path  # the verified, unpacked tree (never run in: boards get clones)
    sha256: str
    size: int
    members: int
    env: FlashEnv
    data_bytes: int = 0
    script_sha256: str = ""  # initrd-flash's bytes as the verified archive carried them


def prepare(
    bundle: Path,
    work_dir: Path,
    expected_sha256: str | None,
    *,
    progress: Progress | None = None,
    budget: Budget | None = None,
    cancel: threading.Event | None = None,
) -> PreparedBundle:
    """Verify + unpack into ``work_dir/bundle`` (work_dir is created 0700)."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(work_dir, 0o700)
    root = work_dir / "bundle"
    u = unpack(bundle, root, expected_sha256, budget=budget, progress=progress, cancel=cancel)
    script = root / "initrd-flash"
    if not script.is_file() or script.is_symlink():
        shutil.rmtree(root, ignore_errors=True)
        raise UserError(
            f"{Path(bundle).name}: no initrd-flash script in the bundle; refused to unpack it",
            hint="Orin bundles from meta-tegra scarthgap carry one",
        )
    prepared = PreparedBundle(
        Path(bundle),
        root,
        u.sha256,
        Path(bundle).stat().st_size,
        u.members,
        u.env,
        u.data_bytes,
        u.member_sha256.get("initrd-flash", ""),
    )
    # The shared files are read-only input for the boards' clones (resolved inside the tree only).
    for p in shared_files(prepared):
        fd = _open_in(root, p)
        if fd is not None:
            try:
                os.fchmod(fd, 0o444)
            finally:
                os.close(fd)
    return prepared


def _open_in(root: Path, rel: str) -> int | None:
    """An fd of the regular file ``root/rel``, no component followed if it is a link
    (``ROOTFS_IMAGE=..`` or a link out of the tree is simply not a shared file)."""
    parts = Path(rel).parts
    if not parts or any(p in ("..", ".", "") for p in parts):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags | os.O_DIRECTORY)
        for part in parts[:-1]:
            nfd = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        ffd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        os.close(fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(ffd).st_mode):
        os.close(ffd)
        return None
    return ffd


def _reflink(src: Path, dst: Path) -> bool:
    try:
        with open(src, "rb") as s, open(dst, "wb") as d:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        shutil.copystat(src, dst)
        return True
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            dst.unlink()
        return False


CHUNK = 1 << 20


def shared_files(prepared: PreparedBundle) -> set[str]:
    """Files every board's copy shares with the read-only master (hard links, when the
    filesystem has no reflinks): only the payloads ``.env.initrd-flash`` names, ``ROOTFS_IMAGE``
    and ``DATAFILE``, when each is a regular file of the tree.

    Why only these (meta-tegra scarthgap, tegra-helper-scripts at the pinned commit):
    initrd-flash.sh hands them to tegra-flash-helper.sh only as names (with ``--no-flash`` the
    APP/DATA partitions point at the ``APPFILE``/``DATAFILE`` placeholders it touches; no
    mksparse runs) and make-sdcard only reads them (dd/bmaptool to the device). Everything
    else may be written in place: ``cp -f signed/* .`` copies tegraflash's signed output
    over existing names, ``cp``/``cat >``/``tee``/``nvflashxmlparse -o`` truncate existing
    files (flash_signed.sh, internal-secureflash.xml, rcm-boot.sh, initrd-flash.xml), and
    NVIDIA's tegraflash.py (not in meta-tegra, so nothing proves what it leaves alone) signs
    and concatenates in the current directory. So every other file is the board's own copy.
    """
    shared = set()
    for rel in prepared.env.payload_files():
        fd = _open_in(prepared.root, rel)  # "..", links, dirs: not a shared file
        if fd is not None:
            os.close(fd)
            if rel != "initrd-flash":
                shared.add(rel)
    return shared


def copy_bytes_needed(prepared: PreparedBundle) -> int:
    """What one board's copy really writes on a filesystem without reflinks: the allocated
    blocks of the files it copies (shared files are hard links; copies keep their holes)."""
    shared = shared_files(prepared)
    total = 0
    for dirpath, _dirs, files in os.walk(prepared.root):
        for f in files:
            p = Path(dirpath) / f
            if str(p.relative_to(prepared.root)) in shared or p.is_symlink():
                continue
            total += p.lstat().st_blocks * 512
    return total


def sparse_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to the new file ``dst`` keeping its holes (SEEK_DATA/SEEK_HOLE): only
    the data is written, never the zeros of a hole."""
    sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(sfd).st_size
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            off = 0
            while off < size:
                try:
                    data = os.lseek(sfd, off, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:
                        break  # only a hole is left
                    raise
                hole = os.lseek(sfd, data, os.SEEK_HOLE)
                _copy_range(sfd, dfd, data, hole)
                off = hole
            os.ftruncate(dfd, size)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    shutil.copystat(src, dst)


def _copy_range(sfd: int, dfd: int, start: int, end: int) -> None:
    """Copy bytes [start, end) at the same offsets: in the kernel (copy_file_range, no trip
    through Python's memory) where it can, else by pread/pwrite."""
    pos = start
    while pos < end:
        try:
            n = os.copy_file_range(sfd, dfd, min(1 << 30, end - pos), pos, pos)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            break  # this pair of filesystems cannot: the loop below copies the rest
        if n == 0:
            return  # the source ended early (it shrank): nothing left to copy
        pos += n
    while pos < end:
        chunk = os.pread(sfd, min(CHUNK, end - pos), pos)
        if not chunk:
            return
        os.pwrite(dfd, chunk, pos)
        pos += len(chunk)


def check_copy_space(prepared: PreparedBundle, boards: int, budget: Budget, where: Path) -> None:
    """Refuse before any board is touched when the per-board copies cannot fit."""
    needs = copy_bytes_needed(prepared) * boards
    free = budget.free(where)
    if needs > free - budget.margin:
        raise UserError(
            f"copying the bundle for {boards} board(s) needs {needs / GB:.1f} GB, {free / GB:.1f} GB free in "
            f"{where} (less a {budget.margin / GB:.1f} GB margin); refused (nothing was flashed)",
            hint="free space there or choose another place: alma flash --work-dir DIR",
        )


def clone_for_board(prepared: PreparedBundle, dest: Path) -> dict[str, str]:
    """A private working copy of the bundle for one board (initrd-flash writes into its dir).

    Reflinks where the filesystem can (true copy-on-write); otherwise only the read-only
    payloads (``shared_files``: the rootfs and data images .env.initrd-flash names) are hard
    links to the master and everything else is copied keeping its holes.
    Returns {relative path: "reflink"|"hardlink"|"copy"|"symlink"}.
    A full disk is a clear error (exit 2) and the half copy is removed.
    """
    try:
        return _clone(prepared, dest)
    except OSError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(
                f"no space left copying the bundle for board {dest.name} in {dest.parent}",
                hint="free space there or choose another place: alma flash --work-dir DIR",
            ) from exc
        raise UserError(
            f"cannot copy the bundle for board {dest.name}: {exc}", hint="check the work directory"
        ) from exc


def _clone(prepared: PreparedBundle, dest: Path) -> dict[str, str]:
    src_root = prepared.root
    shared = shared_files(prepared)
    how: dict[str, str] = {}
    dest.mkdir(parents=True, mode=0o700)
    can_reflink = True
    for dirpath, dirnames, filenames in os.walk(src_root):
        rel_dir = Path(dirpath).relative_to(src_root)
        for d in dirnames:
            s = Path(dirpath) / d
            t = dest / rel_dir / d
            if s.is_symlink():
                os.symlink(os.readlink(s), t)
            else:
                t.mkdir(mode=stat.S_IMODE(s.stat().st_mode) | 0o700)
        for f in filenames:
            s = Path(dirpath) / f
            t = dest / rel_dir / f
            rel = str(rel_dir / f)
            if s.is_symlink():
                os.symlink(os.readlink(s), t)
                how[rel] = "symlink"
                continue
            if can_reflink:
                if _reflink(s, t):
                    how[rel] = "reflink"
                    continue
                can_reflink = False  # this filesystem cannot: do not try for every file
            if rel in shared:
                os.link(s, t)
                how[rel] = "hardlink"
            else:
                sparse_copy(s, t)
                how[rel] = "copy"
    return how


def shared_payload_state(prepared: PreparedBundle) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime_ns) of the shared (hard-linked) files, to prove afterwards nobody
    wrote them (not the ctime: each board's hard link to the file moves it)."""
    out = {}
    for p in sorted(shared_files(prepared)):
        with contextlib.suppress(FileNotFoundError):
            st = (prepared.root / p).lstat()
            out[p] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out
