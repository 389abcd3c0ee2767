"""Read a tegraflash bundle in ONE pass: sha256 of the file and its tar members, together.

meta-tegra (scarthgap, image_types_tegra.bbclass) writes the bundle with
``tar --sparse --numeric-owner --transform=s,^\\./,, -cf- . | gzip -9 -n --rsyncable``, so
members carry bare names (``.env.initrd-flash``, ``initrd-flash``, ``<image>.ext4``) in
readdir order. A 1.6 GB file must not be read twice: every raw chunk is hashed, then fed to
the inflater that tarfile reads from; member data is skipped by inflating and discarding
(no copies), and the stream is inflated to its gzip trailer so a truncated or corrupt
bundle is an error. ``TEGRAFLASH_PACKAGE_FORMAT = "zip"``
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
    complete: bool = False  # True when the tar and its gzip trailer were read to the end

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
    """A forward-only, seekable stream of the *decompressed* tar, fed from raw chunks that
    are hashed as they are read. tarfile (mode ``r:``) skips member data with ``seek``,
    which inflates and discards without copying. ``drain()`` hashes the raw bytes that
    tarfile did not need."""

    def __init__(self, fh: IO[bytes], total: int, progress: Progress | None) -> None:
        self._fh = fh
        self._total = total
        self._progress = progress
        self._z = _zlib()
        self._d = self._z.decompressobj(31)  # 31: gzip header
        self._pending = b""  # compressed bytes not yet inflated (max_length bound)
        self._cur = b""  # the current inflated piece
        self._off = 0
        self.pos = 0  # offset in the decompressed stream
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

    def _fill(self) -> bool:
        """Inflate the next piece into ``_cur``; False at the end of the stream."""
        while True:
            if not self._pending:
                self._pending = self._raw()
                if not self._pending:
                    if not self._d.eof:
                        raise UserError(
                            "bundle is truncated (gzip stream ends early)",
                            hint="rebuild the image or copy the bundle again",
                        )
                    return False
                if self._d.eof:
                    if not self._pending.strip(b"\0"):
                        self._pending = b""  # padding after the last member
                        continue
                    self._d = self._z.decompressobj(31)  # concatenated gzip members are legal gzip
            # Bound each step: a sparse rootfs inflates ~1000:1.
            out = self._d.decompress(self._pending, 4 * CHUNK)
            self._pending = self._d.unconsumed_tail
            if self._d.eof:
                rest = self._d.unused_data + self._pending
                self._pending = rest if rest.strip(b"\0") else b""
                if self._pending:
                    self._d = self._z.decompressobj(31)
            if out:
                self._cur, self._off = out, 0
                return True

    def read(self, n: int = -1) -> bytes:
        need = n if n >= 0 else 1 << 62
        parts = []
        while need > 0:
            if self._off >= len(self._cur) and not self._fill():
                break
            take = self._cur[self._off : self._off + need]
            self._off += len(take)
            need -= len(take)
            parts.append(take)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.pos += len(data)
        return data

    def seek(self, target: int, whence: int = 0) -> int:
        if whence == 1:
            target += self.pos
        if whence not in (0, 1) or target < self.pos:
            raise OSError("bundle stream is forward-only")
        skip = target - self.pos
        while skip > 0:
            avail = len(self._cur) - self._off
            if avail == 0:
                if not self._fill():
                    break
                continue
            step = min(avail, skip)
            self._off += step
            skip -= step
            self.pos += step
        return self.pos

    def tell(self) -> int:
        return self.pos

    def finish(self) -> None:
        """Inflate (and discard) the rest: raises if the gzip stream ends early."""
        self._cur, self._off = b"", 0
        while self._fill():
            self.pos += len(self._cur)

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
        seen: set[str] = set()  # every member name: ROOTFS_IMAGE may come before the env file
        complete = False
        wanted = set(REQUIRED_MEMBERS)
        try:
            with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
                for member in tar:
                    name = member.name.removeprefix("./")
                    seen.add(name)
                    if name == ENV_MEMBER:
                        if not member.isfile() or member.size > ENV_MAX:
                            raise UserError(f"{path}: {ENV_MEMBER} is not a small regular file")
                        f = tar.extractfile(member)  # read into memory only: never written to disk
                        assert f is not None
                        env_text = f.read().decode("utf-8", "replace")
                        rootfs = parse_env(env_text).get("ROOTFS_IMAGE")
                        if rootfs:
                            wanted.add(rootfs)
                complete = True
            # Inflate to the gzip trailer: its CRC and length prove the bundle is whole. (Stopping
            # once the members we check are seen would pass a truncated bundle.)
            stream.finish()
        except (tarfile.TarError, EOFError, _zlib().error) as exc:
            raise UserError(
                f"{path}: not a readable tegraflash tar.gz bundle ({exc})",
                hint="rebuild the image (bitbake <image>) or copy the bundle again; compare its size",
            ) from exc
        stream.drain()
    env = parse_env(env_text) if env_text is not None else None
    return BundleScan(stream.hash.hexdigest(), size, env, sorted(wanted & seen), complete)


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
