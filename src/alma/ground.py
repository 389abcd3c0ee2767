"""The host's ground floor: atomic file writes and UTC timestamps, defined once.

Every part of ``alma`` that writes a file others read (manifests, records, snapshots, pages,
udev rules) writes it through :func:`write_atomic`, and every timestamp it stores or prints
comes from :func:`utc_iso` / :func:`utc_stamp`, so two parts never disagree on a format.
Reading is the sibling module's: every input file (text, YAML, TOML, JSON) goes through
:mod:`alma.loader`.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` via a temp file in the same dir, fsync and rename.

    The file keeps the mode of the file it replaces, else ``mode``, else 0644 less the
    umask (mkstemp's 0600 would hide committed manifests and served pages from readers).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o644 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # the rename itself must survive a power cut too
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def utc_now() -> datetime:
    return datetime.now(UTC)


def utc_iso(t: datetime | float | None = None) -> str:
    """``2026-12-01T08:30:00Z``: whole seconds, UTC, the one stored time format.

    ``t`` is a datetime, a POSIX timestamp, or None for now.
    """
    if t is None:
        t = utc_now()
    elif not isinstance(t, datetime):
        t = datetime.fromtimestamp(t, UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
