"""Read a tegraflash bundle in ONE pass: sha256 of the file and its tar members, together.

meta-tegra (scarthgap, image_types_tegra.bbclass) writes the bundle with
``tar --sparse --numeric-owner --transform=s,^\\./,, -cf- . | gzip -9 -n --rsyncable``, so
members carry bare names (``.env.initrd-flash``, ``initrd-flash``, ``<image>.ext4``) in
readdir order. A 1.6 GB file must not be read twice: every raw chunk is hashed, then fed to
the inflater that tarfile reads from. Inflating stops as soon as every member we check has
been seen; the rest of the file is only hashed. ``TEGRAFLASH_PACKAGE_FORMAT = "zip"``
bundles are hashed in one pass and read through their central directory (no inflating).
"""

from __future__ import annotations

import hashlib
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from alma.errors import UserError

CHUNK = 1 << 20  # 1 MiB reads: hashlib releases the GIL and syscalls stay cheap
ENV_MEMBER = ".env.initrd-flash"
# Bundle members whose presence we check (besides ROOTFS_IMAGE named in the env file).
REQUIRED_MEMBERS = (ENV_MEMBER, "initrd-flash", "flash.xml.in")
ENV_MAX = 64 * 1024  # the env file is a few hundred bytes; refuse anything absurd

Progress = Callable[[int, int], None]


def _zlib() -> Any:
    try:  # isal inflates ~2x faster than zlib; same API
        from isal import isal_zlib

        return isal_zlib
    except ImportError:  # pragma: no cover - isal is a dependency
        import zlib

        return zlib


@dataclass
class BundleScan:
    sha256: str
    size: int
    env: dict[str, str] | None  # parsed .env.initrd-flash, None when absent
    members: list[str] = field(default_factory=list)  # the checked members that were found
    complete: bool = False  # True when every member header was read (no early stop)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "size": self.size,
            "env": self.env,
            "members": self.members,
            "complete": self.complete,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BundleScan:
        return cls(d["sha256"], int(d["size"]), d.get("env"), list(d.get("members", [])), bool(d.get("complete")))


def parse_env(text: str) -> dict[str, str]:
    """Parse the shell assignments of ``.env.initrd-flash`` without executing anything.

    Lines look like ``CHIPID="0x23"``, ``DEFAULTS[BOARDID]="3767"``, ``EXTERNAL_ROOTFS_DRIVE=0``.
    """
    import re
    import shlex

    out: dict[str, str] = {}
    pat = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[[A-Za-z0-9_]+\])?)=(.*)$")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = pat.match(line)
        if not m:
            continue
        try:
            parts = shlex.split(m.group(2), comments=True)
        except ValueError:
            parts = [m.group(2)]
        out[m.group(1)] = " ".join(parts)
    return out


class _HashingInflater:
    """A read()-able stream of the *decompressed* tar, fed from raw chunks that are hashed
    as they are read. ``drain()`` hashes whatever raw bytes tarfile did not need."""

    def __init__(self, fh: IO[bytes], total: int, progress: Progress | None) -> None:
        self._fh = fh
        self._total = total
        self._progress = progress
        self._z = _zlib()
        self._d = self._z.decompressobj(31)  # 31: gzip header
        self._pending = b""  # compressed bytes not yet inflated (max_length bound)
        self._buf = bytearray()
        self._eof = False
        self.hash = hashlib.sha256()
        self.raw_read = 0

    def _raw(self) -> bytes:
        chunk = self._fh.read(CHUNK)
        if chunk:
            self.hash.update(chunk)
            self.raw_read += len(chunk)
            if self._progress:
                self._progress(self.raw_read, self._total)
        return chunk

    def read(self, n: int = -1) -> bytes:
        want = n if n >= 0 else 1 << 62
        while len(self._buf) < want and not self._eof:
            if not self._pending:
                self._pending = self._raw()
                if not self._pending:
                    if not self._d.eof:
                        raise UserError(
                            "bundle is truncated (gzip stream ends early)",
                            hint="rebuild the image or copy the bundle again",
                        )
                    self._eof = True
                    break
            # Bound each step: a sparse rootfs inflates ~1000:1.
            out = self._d.decompress(self._pending, 4 * CHUNK)
            self._pending = self._d.unconsumed_tail
            self._buf += out
            if self._d.eof:
                rest = self._d.unused_data + self._pending
                self._pending = b""
                if rest.strip(b"\0"):  # concatenated gzip members are legal gzip
                    self._d = self._z.decompressobj(31)
                    self._pending = rest
                elif not out:
                    self._eof = True
        take = bytes(self._buf[:want])
        del self._buf[:want]
        return take

    def drain(self) -> None:
        while self._raw():
            pass


def scan_bundle(path: Path, progress: Progress | None = None) -> BundleScan:
    """sha256 + env + checked members of a ``.tegraflash.tar.gz`` or ``.tegraflash.zip``."""
    size = path.stat().st_size
    if path.name.endswith(".zip"):
        return _scan_zip(path, size, progress)
    with path.open("rb", buffering=0) as fh:
        stream = _HashingInflater(fh, size, progress)
        env_text: str | None = None
        found: list[str] = []
        complete = False
        wanted = set(REQUIRED_MEMBERS)
        try:
            with tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK) as tar:  # type: ignore[call-overload]
                for member in tar:
                    name = member.name.removeprefix("./")
                    if name == ENV_MEMBER:
                        if not member.isfile() or member.size > ENV_MAX:
                            raise UserError(f"{path}: {ENV_MEMBER} is not a small regular file")
                        f = tar.extractfile(member)  # read into memory only: never written to disk
                        assert f is not None
                        env_text = f.read().decode("utf-8", "replace")
                        rootfs = parse_env(env_text).get("ROOTFS_IMAGE")
                        if rootfs:
                            wanted.add(rootfs)
                    if name in wanted:
                        found.append(name)
                    if env_text is not None and wanted.issubset(found):
                        break  # everything we check is seen: stop inflating, keep hashing
                else:
                    complete = True
        except (tarfile.TarError, EOFError, _zlib().error) as exc:
            raise UserError(
                f"{path}: not a readable tegraflash tar.gz bundle ({exc})",
                hint="rebuild the image (bitbake <image>) or copy the bundle again; compare its size",
            ) from exc
        stream.drain()
    env = parse_env(env_text) if env_text is not None else None
    return BundleScan(stream.hash.hexdigest(), size, env, found, complete)


def _scan_zip(path: Path, size: int, progress: Progress | None) -> BundleScan:
    h = hashlib.sha256()
    done = 0
    with path.open("rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, size)
    try:
        with zipfile.ZipFile(path) as zf:  # reads only the central directory + one member
            names = set(zf.namelist())
            env_text = zf.read(ENV_MEMBER).decode("utf-8", "replace") if ENV_MEMBER in names else None
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"{path}: not a readable zip bundle ({exc})", hint="rebuild the image") from exc
    env = parse_env(env_text) if env_text is not None else None
    wanted = set(REQUIRED_MEMBERS) | ({env["ROOTFS_IMAGE"]} if env and env.get("ROOTFS_IMAGE") else set())
    return BundleScan(h.hexdigest(), size, env, sorted(wanted & names), True)
