"""The one hashing + inflating stream: the bundle is read from disk exactly once.

Every raw chunk is hashed (sha256) on its way to the gzip inflater (isal, ~2x zlib); the
inflated tar is offered as a forward-only file (``read``, ``seek`` forward, ``tell``) to
tarfile, which parses headers from it while the caller reads member data. ``finish``
inflates to the gzip trailer (its CRC and length prove the bundle whole) and ``drain``
hashes whatever follows, so the digest always covers the whole file.

``threaded=True`` moves read + hash + inflate into a producer thread (isal's threaded igzip
reader, ~2.5x faster than decompressobj; hashlib and isal release the GIL), so they overlap
with the consumer's writes: the unpack uses it.
Inflation is bounded per step (4 MiB out), so a bomb never inflates in one call; the
caller bounds the total by the members' declared sizes (:mod:`.unpack`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
from collections.abc import Callable
from typing import IO, Any

from alma.errors import Interrupted, UserError

CHUNK = 1 << 20  # 1 MiB reads: hashlib releases the GIL and syscalls stay cheap
STEP = 4 * CHUNK  # most inflated bytes per decompress() call
BACK = 512  # one tar block of history
MAX_READ = 16 << 20  # the most tarfile may read in one call (headers, the env file)
Progress = Callable[[int, int], None]  # (compressed bytes read, total)


def zlib_module() -> Any:
    try:  # isal inflates ~2x faster than zlib; same API
        from isal import isal_zlib

        return isal_zlib
    except ImportError:  # pragma: no cover - isal is a dependency
        import zlib

        return zlib


class CorruptBundle(UserError):
    def __init__(self, why: str) -> None:
        self.why = f"truncated or corrupt archive ({why})"
        super().__init__(
            f"{self.why}; refused to unpack it",
            hint="rebuild the image (bitbake <image>) or copy the bundle again; compare its size",
        )


class _Inflater:
    """Raw chunks -> hash -> inflate; ``next_piece`` returns inflated bytes, b"" at the end."""

    def __init__(self, fh: IO[bytes], total: int, progress: Progress | None) -> None:
        self._fh = fh
        self._total = total
        self._progress = progress
        self._z = zlib_module()
        self._d = self._z.decompressobj(31)  # 31: gzip header
        self._pending = b""
        self.hash = hashlib.sha256()
        self.raw_read = 0

    def raw(self) -> bytes:
        chunk = self._fh.read(CHUNK)
        if chunk:
            self.hash.update(chunk)
            self.raw_read += len(chunk)
            if self._progress:
                self._progress(self.raw_read, self._total)
        return chunk

    def next_piece(self) -> bytes:
        try:
            return self._next_piece()
        except self._z.error as exc:
            raise CorruptBundle(str(exc)) from exc

    def _next_piece(self) -> bytes:
        while True:
            if not self._pending:
                self._pending = self.raw()
                if not self._pending:
                    if not self._d.eof:
                        raise CorruptBundle("the gzip stream ends early")
                    return b""
                if self._d.eof:
                    if not self._pending.strip(b"\0"):
                        self._pending = b""  # padding after the last gzip member
                        continue
                    self._d = self._z.decompressobj(31)  # concatenated gzip members are legal gzip
            out = self._d.decompress(self._pending, STEP)
            self._pending = self._d.unconsumed_tail
            if self._d.eof:
                rest = self._d.unused_data + self._pending
                self._pending = rest if rest.strip(b"\0") else b""
                if self._pending:
                    self._d = self._z.decompressobj(31)
            if out:
                return out

    def drain(self) -> None:
        while self.raw():
            pass


class _HashingRaw(io.RawIOBase):
    """Hashes every byte that passes through on its way to igzip's reader thread."""

    def __init__(self, inf: _Inflater) -> None:
        self.inf = inf

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.inf._fh.readinto(b)  # type: ignore[attr-defined]
        if n:
            view = memoryview(b)[:n]
            self.inf.hash.update(view)
            self.inf.raw_read += n
            if self.inf._progress:
                self.inf._progress(self.inf.raw_read, self.inf._total)
        return n or 0


def _open_threaded(inf: _Inflater) -> Any:
    from isal import igzip_threaded

    return igzip_threaded.open(_HashingRaw(inf), "rb", threads=1, block_size=CHUNK)


class BundleStream:
    """A forward-only file of the inflated tar; ``sha256()`` once ``finish``/``drain`` ran."""

    def __init__(
        self,
        fh: IO[bytes],
        total: int,
        progress: Progress | None = None,
        *,
        threaded: bool = False,
        cancel: threading.Event | None = None,
    ) -> None:
        self._inf = _Inflater(fh, total, progress)
        self._cur = b""
        self._prev = b""  # the tail of the piece before _cur: tarfile peeks one byte back
        self._off = 0
        self._eof = False
        self.pos = 0
        self._cancel = cancel
        self._dec: Any = _open_threaded(self._inf) if threaded else None

    def _piece(self) -> bytes:
        if self._cancel is not None and self._cancel.is_set():
            raise Interrupted("interrupted while unpacking the bundle; nothing was flashed")
        if self._dec is None:
            return self._inf.next_piece()
        try:
            piece: bytes = self._dec.read(STEP)
        except EOFError as exc:
            raise CorruptBundle(str(exc) or "the gzip stream ends early") from exc
        except (OSError, ValueError) as exc:  # BadGzipFile, bad CRC, bad data
            raise CorruptBundle(str(exc)) from exc
        return piece  # b"" at the end; bytes after the gzip data are hashed by drain()

    def _fill(self) -> bool:
        if self._eof:
            return False
        piece = self._piece()
        if not piece:
            self._eof = True
            return False
        self._prev = self._cur[-BACK:] if self._cur else self._prev
        self._cur, self._off = piece, 0
        return True

    # -- the file interface tarfile needs -------------------------------------------
    def read(self, n: int = -1) -> bytes:
        # tarfile reads pax/GNU long-name headers whole: a header claiming gigabytes is a
        # memory bomb, not a bundle (member data goes through read_piece, in bounded pieces)
        if n < 0 or n > MAX_READ:
            from alma.tegraflash.members import UnsafeBundle

            raise UnsafeBundle(f"a tar header claims {n} bytes of metadata")
        need = n
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

    def read_piece(self, most: int) -> bytes:
        """Up to ``most`` bytes without joining pieces (zero-copy slices for the writer)."""
        if self._off >= len(self._cur) and not self._fill():
            return b""
        end = min(len(self._cur), self._off + most)
        view = memoryview(self._cur)[self._off : end]
        self._off = end
        self.pos += len(view)
        return view  # type: ignore[return-value]

    def seek(self, target: int, whence: int = 0) -> int:
        if whence == 1:
            target += self.pos
        if whence not in (0, 1):
            raise OSError("bundle stream is forward-only")
        if target < self.pos:
            self._back(self.pos - target)
            return self.pos
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

    def _back(self, back: int) -> None:
        """tarfile checks ``seek(offset - 1); read(1)`` after each member: up to BACK bytes."""
        if back <= self._off:
            self._off -= back
        elif back <= self._off + len(self._prev):
            extra = back - self._off
            self._cur = bytes(self._prev[len(self._prev) - extra :]) + bytes(self._cur)
            self._off = 0
        else:
            raise OSError("bundle stream is forward-only")
        self.pos -= back

    def tell(self) -> int:
        return self.pos

    def finish(self) -> None:
        """Inflate (and discard) the rest: raises if the gzip stream ends early or is corrupt."""
        self._cur, self._off = b"", 0
        while self._fill():
            self.pos += len(self._cur)
            self._off = len(self._cur)

    def close(self) -> None:
        """Stop the producer thread (if any); safe to call twice."""
        if self._dec is not None:
            with contextlib.suppress(Exception):
                self._dec.close()
            self._dec = None

    def drain(self) -> None:
        """Hash the raw bytes the inflater did not need (after ``finish``)."""
        self.close()
        self._inf.drain()

    def sha256(self) -> str:
        return self._inf.hash.hexdigest()

    @property
    def raw_read(self) -> int:
        return self._inf.raw_read
