"""Small file helpers: atomic durable writes, tolerant sysfs reads, UTC timestamps."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any


def iso(ts: float | None = None) -> str:
    """ISO 8601 UTC with a Z, second precision (the formats.md convention)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def parse_iso(text: str) -> float:
    """Inverse of :func:`iso` (seconds since the epoch); ValueError on anything else."""
    import calendar

    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def write_atomic(
    path: Path, data: bytes, *, durable: bool = True, mode: int | None = 0o644, exclusive: bool = False
) -> None:
    """Write ``path`` so a reader sees the old or the new content, never half of it.

    ``durable`` fsyncs the file and its directory: the forensics ring must survive an
    abrupt reset; the /run state file (tmpfs) does not need it. ``mode=None`` keeps the mode
    of the file replaced, else 0644 less the umask (the host's records and manifests).
    ``exclusive``: create ``path`` only if it does not exist (FileExistsError otherwise), as
    O_EXCL would, but complete or not at all: the content is written and synced under a
    temporary name first and then linked into place (a full disk leaves no empty file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o644 & ~umask
    # A unique sibling name opened O_EXCL (tempfile would cost ~8 ms of imports per run).
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)  # through our own fd: the name could be swapped
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    write_atomic(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), durable=durable)


def read_json(path: Path, limit: int = 1 << 20) -> Any | None:
    """The JSON in ``path``; None when absent or not valid JSON (a torn or foreign file).

    Hostile too: a file over ``limit`` bytes is not read, and JSON nested deeper than the
    interpreter's recursion limit is "not valid", never a crash of the reader.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            return None
        return json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def read_json_object(path: Path, limit: int = 1 << 20) -> dict[str, Any]:
    """The JSON object in ``path``; {} when absent, unreadable, not JSON or not an object."""
    data = read_json(path, limit)
    return data if isinstance(data, dict) else {}


READ_LIMIT = 64 * 1024  # sysfs attributes are one page; /proc files the board reads fit easily


def read_text(path: Path, limit: int = READ_LIMIT) -> str | None:
    """Stripped content of a sysfs/procfs attribute, at most its first ``limit`` bytes (a
    165 MB fake meminfo costs one 64 KiB read); None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def boottime() -> float:
    """Seconds since boot, suspend included (CLOCK_BOOTTIME): what freshness is measured on.
    A wall-clock step (NTP, RTC, an operator) never moves it."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


BOOTTIME_STEP_S = 0.001  # a state file's ``boottime`` resolution (docs/formats.md)


def boottime_stamp(now_boottime: float) -> float:
    """``now_boottime`` as a state file carries it: whole milliseconds, rounded DOWN. A stamp
    rounded up would lie up to half a step in the future, and a reader right after the
    write would judge a fresh file "dated in the future" (never fresh)."""
    return math.floor(now_boottime * 1000) / 1000


def state_age(state: dict[str, Any], *, wall: float, boot: str, now_boottime: float) -> float:
    """How old a state file is, in seconds; infinity when it cannot be trusted to be fresh.

    Same boot and a ``boottime`` field: measured on CLOCK_BOOTTIME, so a wall-clock step
    either way changes nothing; a stamp up to one step (1 ms) ahead of ``now_boottime`` is
    the float arithmetic of the stamp, age 0. Another boot's file: infinity (its writer is
    gone). Only a file without ``boot_id`` (an older writer) is judged by its wall-clock
    ``updated``, and one dated in the future (beyond the 2 s of second rounding) is infinity
    too. Read ``now_boottime`` AFTER the file: a file written after the clock was read is
    later than that reading, not from the future."""
    bt = state.get("boottime")
    sid = state.get("boot_id")
    if sid is not None:
        if sid != boot or boot == "unknown" or not isinstance(bt, int | float) or isinstance(bt, bool):
            return float("inf")
        age = now_boottime - float(bt)
        return max(0.0, age) if age >= -BOOTTIME_STEP_S else float("inf")
    try:
        age = wall - parse_iso(str(state.get("updated")))
    except ValueError:
        return float("inf")
    return max(0.0, age) if age >= -2.0 else float("inf")


def boot_id(path: Path) -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``); "unknown" if unreadable."""
    return read_text(path) or "unknown"
