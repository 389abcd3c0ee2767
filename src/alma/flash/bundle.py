"""Verify and unpack a tegraflash bundle in one pass, then give each board its own copy.

One pass: the compressed bytes are hashed (sha256) by the reader that feeds the gzip
decoder, which feeds tarfile in stream mode, so the 1.6 GB bundle is read from disk once
and the hash, the decompression (isal's igzip, in its own thread) and the writes overlap.

The unpacked tree only becomes ``<work>/bundle`` after the archive ended cleanly *and*
the hash matched; until then it lives in a ``.extract-*`` directory that is removed on
any error, so nothing half-extracted ever looks valid. The bundle file is only read.

Extraction is safe: absolute names, ``..`` components, device files, fifos and links
pointing outside are refused (our checks plus tarfile's ``data_filter``). GNU ``--sparse``
members (meta-tegra makes the bundle with ``tar --sparse``) are written with holes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from alma.errors import UserError
from alma.flash.envfile import FlashEnv, read_env

CHUNK = 1 << 20
FICLONE = 0x40049409  # linux/fs.h: reflink a whole file (btrfs, xfs, bcachefs)

Progress = Callable[[int, int], None]  # (compressed bytes read, total)


class _HashingReader(io.RawIOBase):
    """Hashes every byte that passes through on its way to the decoder."""

    def __init__(self, raw: IO[bytes], total: int, progress: Progress | None) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.count = 0
        self.total = total
        self.progress = progress

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.raw.readinto(b)  # type: ignore[attr-defined]
        if n:
            self.sha.update(memoryview(b)[:n])
            self.count += n
            if self.progress:
                self.progress(self.count, self.total)
        return n or 0

    def drain(self) -> None:
        """Hash whatever the decoder did not need (so the hash covers the whole file)."""
        buf = bytearray(CHUNK)
        while self.readinto(buf):
            pass


@dataclass
class PreparedBundle:
    source: Path
    root: Path  # the verified, unpacked tree (never run in: boards get clones)
    sha256: str
    size: int
    members: int
    env: FlashEnv


def _refuse(bundle: Path, why: str, hint: str | None = None) -> UserError:
    return UserError(
        f"{bundle.name}: {why}; refused to unpack it",
        hint=hint or "rebuild the bundle, or copy it again from the build host (alma verify shows its sha256)",
    )


def _member_filter(bundle: Path) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]:
    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        name = member.name
        parts = PurePosixPath(name).parts
        if name.startswith("/") or (parts and parts[0] == "/"):
            raise _refuse(bundle, f"member {name!r} has an absolute path")
        if ".." in parts:
            raise _refuse(bundle, f"member {name!r} climbs out with '..'")
        if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
            raise _refuse(bundle, f"member {name!r} is a device or fifo")
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise _refuse(bundle, f"member {name!r}: {exc}") from exc

    return check


def _open_decoder(reader: _HashingReader) -> IO[bytes]:
    try:
        from isal import igzip_threaded

        # threads=1: the raw read + hash + inflate run in a second thread while this one writes.
        return igzip_threaded.open(reader, "rb", threads=1, block_size=CHUNK)
    except ImportError:  # pragma: no cover - isal is a dependency; stdlib fallback keeps it working
        import gzip

        return gzip.GzipFile(fileobj=reader, mode="rb")  # type: ignore[return-value]


def extract_verified(
    bundle: Path,
    dest: Path,
    expected_sha256: str | None,
    *,
    progress: Progress | None = None,
) -> tuple[str, int]:
    """Unpack ``bundle`` (tar.gz) into the new directory ``dest``, hashing while decompressing.

    Returns (sha256, member count). On any problem ``dest`` does not exist afterwards.
    """
    bundle = Path(bundle)
    dest = Path(dest)
    try:
        raw = open(bundle, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UserError(
            f"cannot read bundle {bundle}: {exc.strerror}", hint="check the path (alma verify prints it)"
        ) from exc
    total = os.fstat(raw.fileno()).st_size
    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))  # mode 0700
    members = 0
    try:
        with raw:
            reader = _HashingReader(raw, total, progress)
            decoder = _open_decoder(reader)
            try:
                check = _member_filter(bundle)
                with tarfile.open(fileobj=decoder, mode="r|", bufsize=CHUNK) as tar:
                    tar.copybufsize = CHUNK  # type: ignore[attr-defined]  # default 16 KiB: tiny writes
                    for member in tar:
                        safe = check(member, str(tmp))
                        if safe is None:
                            continue
                        tar.extract(safe, tmp, set_attrs=not safe.isdir(), filter="fully_trusted")
                        members += 1
                # Past tar's end-of-archive: read the rest so gzip's CRC/length are checked.
                while decoder.read(CHUNK):
                    pass
            finally:
                decoder.close()
            reader.drain()
        digest = reader.sha.hexdigest()
    except UserError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _refuse(bundle, f"truncated or corrupt archive ({exc})") from exc
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise UserError(
                f"no space left unpacking {bundle.name} into {dest.parent}",
                hint="free space there or choose another place: alma flash --work-dir DIR",
            ) from exc
        if exc.errno is not None:
            raise UserError(f"cannot unpack {bundle.name}: {exc}", hint="check the work directory") from exc
        # gzip decoders raise errno-less OSErrors (BadGzipFile) for bad data
        raise _refuse(bundle, f"truncated or corrupt archive ({exc})") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if expected_sha256 and digest != expected_sha256.lower():
        shutil.rmtree(tmp, ignore_errors=True)
        raise _refuse(
            bundle,
            f"sha256 mismatch: the facts manifest expects {expected_sha256}, the file is {digest}",
            hint="the bundle changed since `alma verify` recorded it: re-run alma verify on the build host, "
            "or copy the right bundle",
        )
    os.replace(tmp, dest)
    return digest, members


def prepare(
    bundle: Path,
    work_dir: Path,
    expected_sha256: str | None,
    *,
    progress: Progress | None = None,
) -> PreparedBundle:
    """Verify + unpack into ``work_dir/bundle`` (work_dir is created 0700)."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(work_dir, 0o700)
    root = work_dir / "bundle"
    digest, members = extract_verified(bundle, root, expected_sha256, progress=progress)
    try:
        env = read_env(root)
    except UserError:
        shutil.rmtree(root, ignore_errors=True)
        raise
    script = root / "initrd-flash"
    if not script.is_file():
        shutil.rmtree(root, ignore_errors=True)
        raise _refuse(
            bundle, "no initrd-flash script in the bundle", hint="Orin bundles from meta-tegra scarthgap carry one"
        )
    # The master copy is read-only input for the boards' clones.
    for p in env.payload_files():
        with contextlib.suppress(FileNotFoundError):
            os.chmod(root / p, 0o444)
    return PreparedBundle(bundle, root, digest, Path(bundle).stat().st_size, members, env)


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


def clone_for_board(prepared: PreparedBundle, dest: Path) -> dict[str, str]:
    """A private working copy of the bundle for one board (initrd-flash writes into its dir).

    Reflinks where the filesystem can (true copy-on-write); otherwise the large read-only
    payloads (rootfs and data images, per .env.initrd-flash) are hard links to the master
    and everything else is copied. Returns {relative path: "reflink"|"hardlink"|"copy"}.
    """
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
