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
    # The master copy is read-only input for the boards' clones.
    for p in u.env.payload_files():
        with contextlib.suppress(FileNotFoundError):
            if not (root / p).is_symlink():
                os.chmod(root / p, 0o444)
    return PreparedBundle(Path(bundle), root, u.sha256, Path(bundle).stat().st_size, u.members, u.env, u.data_bytes)


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


def copy_bytes_needed(prepared: PreparedBundle) -> int:
    """What one board's copy costs on a filesystem without reflinks (payloads are hard links)."""
    shared = set(prepared.env.payload_files())
    total = 0
    for dirpath, _dirs, files in os.walk(prepared.root):
        for f in files:
            p = Path(dirpath) / f
            if str(p.relative_to(prepared.root)) in shared or p.is_symlink():
                continue
            total += p.lstat().st_blocks * 512
    return total


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

    Reflinks where the filesystem can (true copy-on-write); otherwise the large read-only
    payloads (rootfs and data images, per .env.initrd-flash) are hard links to the master
    and everything else is copied. Returns {relative path: "reflink"|"hardlink"|"copy"|"symlink"}.
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
    shared = set(prepared.env.payload_files())
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
                shutil.copy2(s, t)
                how[rel] = "copy"
    return how


def shared_payload_state(prepared: PreparedBundle) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of the hard-linked payloads, to prove afterwards nobody wrote them."""
    out = {}
    for p in prepared.env.payload_files():
        with contextlib.suppress(FileNotFoundError):
            st = (prepared.root / p).stat()
            out[p] = (st.st_size, st.st_mtime_ns)
    return out
