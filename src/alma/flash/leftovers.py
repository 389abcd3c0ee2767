"""What a killed ``alma flash`` leaves behind, found and cleaned at the next start.

Each work dir ``run-*`` carries ``.alma-run``: the pid, its start time (``/proc/PID/stat``
field 22) and the boot id of the run that made it. At the next start, a ``run-*`` of the
runner's whose maker is gone (another boot, a dead pid, a reused pid with another start
time) is removed and reported with its size; one without the note (made by an older alma,
or a run killed between mkdtemp and the note) is only reported, with the command that
removes it. A live run's dir is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

NOTE = ".alma-run"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[-1].split()[19]  # field 22 (after the comm in parentheses)


def mark_run(run: Path) -> None:
    note = {"pid": os.getpid(), "start": _start_time(os.getpid()), "boot_id": _boot_id()}
    fd = os.open(run / NOTE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(note, fh)


def _alive(note: dict[str, object]) -> bool:
    if note.get("boot_id") != _boot_id():
        return False
    pid = note.get("pid")
    return isinstance(pid, int) and pid > 0 and _start_time(pid) == note.get("start")


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def clean_stale_runs(base: Path) -> list[str]:
    """Remove the runner's stale ``run-*`` dirs in ``base``; one message per dir found."""
    out: list[str] = []
    me = os.geteuid()
    for run in sorted(base.glob("run-*")):
        try:
            st = run.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
            continue
        try:
            fd = os.open(run / NOTE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd) as fh:
                note = json.loads(fh.read(4096))
        except (OSError, ValueError):
            note = None
        size = _size(run) / 1e9
        if not isinstance(note, dict):
            out.append(
                f"{run} ({size:.1f} GB) was left by an earlier alma flash that did not say who made it; "
                f"if no flash is running, remove it: rm -rf {run}"
            )
            continue
        if _alive(note):
            continue
        shutil.rmtree(run, ignore_errors=True)
        out.append(f"removed {run} ({size:.1f} GB), left by a killed alma flash (pid {note.get('pid')})")
    return out
