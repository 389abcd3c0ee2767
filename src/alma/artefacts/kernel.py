"""The kernel version, read from the kernel image itself (its ``Linux version ...`` banner).

The arm64 ``Image`` is raw (magic ``ARM\\x64`` at 0x38); ``Image.gz`` is gzip. The banner
(``linux_banner`` in init/version.c) is a literal string in .rodata, so a byte scan finds it
without parsing ELF or sections. Chunks overlap so a banner across a boundary is not missed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from alma.errors import UserError
from alma.ground import open_regular

BANNER = b"Linux version "
# "Linux version 5.15.185-l4t-r36.5-1033.33+g9c6d5c8154 (oe-user@oe-host) (...) #1 SMP ..."
_RELEASE = re.compile(rb"Linux version (\d+\.\d+(?:\.\d+)?[^\s()]*) \(")
_CHUNK = 1 << 20
_OVERLAP = 512  # longer than any banner
ARM64_MAGIC = b"ARM\x64"


@dataclass
class KernelFacts:
    release: str  # e.g. 5.15.185-l4t-r36.5-1033.33+g9c6d5c8154
    banner: str  # the whole line, up to the first NUL/newline
    compressed: bool
    arm64_image: bool  # raw arm64 Image header seen (magic at 0x38)


def _chunks(path: Path) -> Iterator[tuple[bool, bytes]]:
    with os.fdopen(open_regular(path), "rb") as fh:  # a FIFO in the deploy dir never blocks verify
        head = fh.read(2)
        fh.seek(0)
        if head == b"\x1f\x8b":
            from alma.artefacts.bundle import _zlib

            d = _zlib().decompressobj(31)
            while raw := fh.read(_CHUNK):
                pending = raw
                while pending:
                    yield True, d.decompress(pending, 4 * _CHUNK)
                    pending = d.unconsumed_tail
                    if d.eof:
                        return
            return
        while chunk := fh.read(_CHUNK):
            yield False, chunk


def read_kernel(path: Path) -> KernelFacts:
    """Find the banner; a kernel image without one is an error (wrong file, truncated)."""
    tail = b""
    first = True
    arm64 = False
    compressed = False
    for compressed, chunk in _chunks(path):
        if first:
            arm64 = chunk[0x38:0x3C] == ARM64_MAGIC
            first = False
        buf = tail + chunk
        at = buf.find(BANNER)
        while at >= 0:
            m = _RELEASE.match(buf, at)
            if m:
                end = len(buf)
                for stop in (b"\0", b"\n"):
                    i = buf.find(stop, at)
                    if 0 <= i < end:
                        end = i
                if end == len(buf) and len(buf) - at < _OVERLAP:
                    break  # banner cut by the chunk edge: read on
                banner = buf[at:end].decode("ascii", "replace").strip()
                return KernelFacts(m.group(1).decode("ascii"), banner, compressed, arm64)
            # "Linux version %s" format strings etc.: keep looking
            at = buf.find(BANNER, at + 1)
        tail = buf[-_OVERLAP:]
    raise UserError(
        f"{path}: no 'Linux version' banner found: not a Linux kernel image, or truncated",
        hint="check the file (file/ls -l), rebuild the kernel: bitbake virtual/kernel",
    )
