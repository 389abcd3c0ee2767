"""What a killed ``alma flash`` leaves behind, found and cleaned at the next start.

Each work dir ``run-*`` carries ``.alma-run``: the pid, its start time (``/proc/PID/stat``
field 22) and the boot id of the run that made it, and ``.alma-live``, flocked by alma for
the whole run; every flasher inherits that descriptor (``pass_fds``), so the lock is held
while **any** process of the run lives: alma, a flasher, or a child that kept it. Before a
board's flasher starts, ``.alma-flasher-<usb instance>.json`` records what its record
needs; it is removed once the board's record is written. At the next start a ``run-*`` of
the runner's is removed only when its ``.alma-live`` can be locked (every process of the
run is gone; a zombie counts as gone: it has ended and closed its files, only its exit
status waits for a parent that may never come). A run whose flasher outlived its alma is
kept and named; once it is gone, each board still noted gets its record ("interrupted:
alma killed, flasher ran until …", with its logs) before the dir goes. A run without the
note (an older alma, or killed between mkdtemp and the note) is only reported, with the
command that removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NOTE = ".alma-run"
LIVE = ".alma-live"
FLASHER_NOTE = ".alma-flasher-"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class KilledFlash:
    """A board whose alma was killed while its flasher ran: what its record needs."""

    run: Path
    board_dir: Path
    alma_pid: object
    ended: float  # the last write in the board's dir: when its flasher stopped writing
    info: dict[str, Any]


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, process group, start time) of ``pid``, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()  # after the comm in parentheses: field 3 on
    return fields[0], int(fields[2]), fields[19]


def _start_time(pid: int) -> str | None:
    st = _stat(pid)
    return st[2] if st else None


def _write_note(path: Path, note: dict[str, object]) -> None:
    fd = os.open(path, _CREATE, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(note, fh)


def mark_run(run: Path) -> int:
    """Note who made ``run`` and lock its ``.alma-live``: the descriptor returned must be kept
    open for the whole run and handed to every flasher (it is what says the run is alive)."""
    fd = os.open(run / LIVE, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and private: never contended
    _write_note(run / NOTE, {"pid": os.getpid(), "start": _start_time(os.getpid()), "boot_id": _boot_id()})
    return fd


def _run_lives(run: Path) -> bool | None:
    """True while a process of the run holds ``.alma-live``; None for a run without one."""
    try:
        fd = os.open(run / LIVE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _flasher_note(run: Path, usb_instance: str) -> Path:
    return run / (FLASHER_NOTE + usb_instance.replace("/", "_") + ".json")


def mark_flasher(run: Path, usb_instance: str, info: dict[str, Any]) -> None:
    """The board's flasher is about to start; ``info`` is what its record needs if alma is killed."""
    _write_note(_flasher_note(run, usb_instance), {"info": info})


def flasher_done(run: Path, usb_instance: str) -> None:
    """The board's record is written: nothing to report for it after a kill."""
    with contextlib.suppress(OSError):
        _flasher_note(run, usb_instance).unlink()


def _process_alive(pid: object, start: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] != "Z"


def _read_json(path: Path) -> Any:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd) as fh:
            return json.loads(fh.read(1 << 16))
    except (OSError, ValueError):
        return None


def _file_stats(path: Path) -> Iterator[os.stat_result]:
    """lstat of every file below ``path``; one that vanishes meanwhile is skipped."""
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            yield st


def _size(path: Path) -> int:
    return sum(st.st_blocks * 512 for st in _file_stats(path))


def _last_write(path: Path) -> float:
    return max((st.st_mtime for st in _file_stats(path)), default=0.0)


def clean_stale_runs(base: Path, on_killed: Callable[[KilledFlash], None] | None = None) -> list[str]:
    """Remove the runner's stale ``run-*`` dirs in ``base``; one message per dir found.

    ``on_killed`` is called for each board whose flasher outlived its alma, before its dir
    is removed (the caller writes its record and keeps its logs).
    """
    out: list[str] = []
    me = os.geteuid()
    boot = _boot_id()
    for run in sorted(base.glob("run-*")):
        try:
            st = run.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
            continue
        note = _read_json(run / NOTE)
        size = _size(run) / 1e9
        if not isinstance(note, dict):
            out.append(
                f"{run} ({size:.1f} GB) was left by an earlier alma flash that did not say who made it; "
                f"if no flash is running, remove it: rm -rf {run}"
            )
            continue
        lives = _run_lives(run)
        alma_alive = note.get("boot_id") == boot and _process_alive(note.get("pid"), note.get("start"))
        if alma_alive and lives is not False:
            continue
        if lives:
            out.append(
                f"kept {run}: its alma flash (pid {note.get('pid')}) was killed but its initrd-flash still runs "
                "(it holds the board's lock and this run's until it ends)"
            )
            continue
        flashers = [_read_json(p) for p in sorted(run.glob(FLASHER_NOTE + "*.json"))]
        flashers_ok = [f for f in flashers if isinstance(f, dict)]
        for f in flashers_ok:
            info = f.get("info")
            if on_killed is not None and isinstance(info, dict):
                board_dir = run / "boards" / Path(str(info.get("board_dir", ""))).name
                on_killed(KilledFlash(run, board_dir, note.get("pid"), _last_write(board_dir), info))
        shutil.rmtree(run, ignore_errors=True)
        out.append(f"removed {run} ({size:.1f} GB), left by a killed alma flash (pid {note.get('pid')})")
    return out
