"""The host's ground floor: atomic file writes and UTC timestamps, defined once.

Every part of ``alma`` that writes a file others read (manifests, records, snapshots, pages,
udev rules) writes it through :func:`write_atomic`, and every timestamp it stores or prints
comes from :func:`utc_iso` / :func:`utc_stamp`, so two parts never disagree on a format.
Reading is the sibling module's: every input file (text, YAML, TOML, JSON) goes through
:mod:`alma.loader`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

from almaboard.files import iso as board_iso
from almaboard.files import write_atomic as board_write_atomic

from alma.errors import UserError


def write_atomic(path: Path, text: str, mode: int | None = None, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` atomically and durably (temp file, fsync, rename, fsync of
    the directory) with the board library's one implementation, shared with the on-board tools.
    ``durable=False`` leaves out the fsyncs (still atomic: a reader never sees half a file)
    for files that are re-derived anyway, where 1000 fsyncs would cost more than the work.

    The file keeps the mode of the file it replaces, else ``mode``, else 0644 less the
    umask (a 0600 temp file would hide committed manifests and served pages from readers).
    """
    if mode is None:
        with contextlib.suppress(FileNotFoundError):
            mode = path.stat().st_mode & 0o7777
    board_write_atomic(path, text.encode("utf-8"), durable=durable, mode=mode)


class NotARegularFile(UserError):
    """An input path that is a FIFO, a device, a socket or a directory: never read as a file."""

    def __init__(self, path: Path | str, kind: str) -> None:
        super().__init__(
            f"{path} is {kind}, not a regular file; refused (nothing reads it)",
            hint="point at the file itself (alma verify names the bundle it found)",
        )


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}  # fmt: skip


def file_kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_regular(path: Path | str) -> int:
    """An fd (O_RDONLY, blocking again) of ``path`` only if it is a regular file.

    Opened with O_NONBLOCK first, so a FIFO put where a file was expected never blocks
    (neither here nor between a check and the open), then fstat'ed: what is judged is what
    was opened. Raises :class:`NotARegularFile` (or the OSError of the open).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(path, file_kind(st.st_mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def utc_now() -> datetime:
    return datetime.now(UTC)


def utc_iso(t: datetime | float | None = None) -> str:
    """``2026-12-01T08:30:00Z``: whole seconds, UTC, the one stored time format.

    ``t`` is a datetime, a POSIX timestamp, or None for now.
    """
    return board_iso(t.timestamp() if isinstance(t, datetime) else t)  # the board library's one format


def utc_stamp(t: datetime | float | None = None) -> str:
    """``20261201-083000``: the same instant for file names (sorts like the time)."""
    return utc_iso(t).replace("-", "").replace(":", "").replace("T", "-").rstrip("Z")


def parse_utc(value: object) -> datetime:
    """The inverse of :func:`utc_iso`; any ISO 8601 time with a zone. ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"time is not a string: {value!r}")
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(f"time has no timezone: {value!r}")
    return t
