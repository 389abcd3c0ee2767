"""Pausing and resuming the work: cgroup v2 ``cgroup.freeze``, SIGSTOP/SIGCONT as fallback.

Never kills: the only signals sent are SIGSTOP and SIGCONT. The pause is recorded in
``/run/alma-guard/paused.json`` so a guard restarted after a crash (or kill -9) adopts a
pause it did not make itself instead of leaving the work stopped forever.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from .fsutil import read_json, read_text, write_json


def cgroup2_root(cgroup_root: Path) -> Path:
    """Where the cgroup v2 hierarchy is: ``/sys/fs/cgroup`` (unified, systemd's default),
    or ``/sys/fs/cgroup/unified`` on a hybrid v1/v2 system."""
    if not (cgroup_root / "cgroup.controllers").exists() and (cgroup_root / "unified" / "cgroup.controllers").exists():
        return cgroup_root / "unified"
    return cgroup_root


def slice_path(cgroup_root: Path, unit: str) -> Path:
    """The cgroup directory systemd uses for a slice.

    systemd nests slices by their dashes: ``alma-work.slice`` lives at
    ``/sys/fs/cgroup/alma.slice/alma-work.slice``. A value with a slash is taken as a
    cgroup path relative to the root instead.
    """
    cgroup_root = cgroup2_root(cgroup_root)
    if "/" in unit:
        return cgroup_root / unit.strip("/")
    if not unit.endswith(".slice"):
        return cgroup_root / unit
    stem = unit[: -len(".slice")]
    if stem == "-" or not stem:
        return cgroup_root
    parts = stem.split("-")
    chain = ["-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))]
    return cgroup_root.joinpath(*chain)


def proc_state(proc: Path, pid: int) -> str | None:
    """The one-letter state from /proc/PID/stat (R, S, D, T, t, Z, ...), None if gone."""
    text = read_text(proc / str(pid) / "stat")
    if not text:
        return None
    # "pid (comm) S ..." - comm may contain spaces and parentheses: split on the last ')'.
    rest = text.rsplit(")", 1)[-1].split()
    return rest[0] if rest else None


def _cgroup_pids(cg: Path) -> list[int]:
    pids: list[int] = []
    if not cg.is_dir():
        return pids
    for dirpath, _dirs, files in os.walk(cg):
        if "cgroup.procs" in files:
            text = read_text(Path(dirpath) / "cgroup.procs") or ""
            pids.extend(int(x) for x in text.split() if x.isdigit())
    return sorted(set(pids))


def _write_existing(path: Path, data: bytes) -> None:
    """Write a cgroupfs control file; never create it (its absence means no freezer here)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass
class PauseResult:
    method: str  # "freeze", "sigstop", "none"
    detail: str
    pids: list[int] = field(default_factory=list)


class Pauser:
    """Pause/resume every process in one cgroup (a systemd slice)."""

    def __init__(self, cgroup: Path, record: Path, proc: Path = Path("/proc")) -> None:
        self.cgroup = cgroup
        self.record = record
        self.proc = proc
        self.method: str | None = None
        self.stopped: set[int] = set()
        self._adopt()

    # -- state kept across guard restarts ------------------------------------------------
    def _adopt(self) -> None:
        rec = read_json(self.record)
        if isinstance(rec, dict) and rec.get("cgroup") == str(self.cgroup):
            self.method = rec.get("method") if rec.get("method") in ("freeze", "sigstop", "none") else None
            self.stopped = {int(p) for p in rec.get("pids", []) if isinstance(p, int)}
        elif (read_text(self.cgroup / "cgroup.freeze") or "0") == "1":
            self.method = "freeze"  # frozen by a previous guard that left no record

    def _save(self) -> None:
        if self.method is None:
            with contextlib.suppress(FileNotFoundError):
                self.record.unlink()
            return
        write_json(
            self.record,
            {"cgroup": str(self.cgroup), "method": self.method, "pids": sorted(self.stopped)},
            durable=False,
        )

    @property
    def paused(self) -> bool:
        return self.method is not None

    # -- actions -----------------------------------------------------------------------
    def pause(self) -> PauseResult:
        """Freeze the cgroup; fall back to SIGSTOP when cgroup.freeze cannot be written."""
        freeze = self.cgroup / "cgroup.freeze"
        if not self.cgroup.is_dir():
            self.method = "none"
            self._save()
            return PauseResult("none", f"{self.cgroup} does not exist (no work running); will pause it if it appears")
        try:
            _write_existing(freeze, b"1")
            self.method = "freeze"
            self._save()
            return PauseResult("freeze", f"froze {self.cgroup}")
        except OSError as exc:
            why = errno.errorcode.get(exc.errno or 0, str(exc))
        res = self._sigstop_all()
        res.detail = f"cgroup.freeze not writable ({why}): {res.detail}"
        return res

    def _sigstop_all(self) -> PauseResult:
        me = os.getpid()
        for pid in _cgroup_pids(self.cgroup):
            if pid == me or pid in self.stopped:
                continue
            if proc_state(self.proc, pid) in ("T", "t"):
                continue  # stopped by someone else (a debugger, its owner): not ours to continue later
            try:
                os.kill(pid, signal.SIGSTOP)
                self.stopped.add(pid)
            except ProcessLookupError:
                continue
            except PermissionError:
                continue  # reported through the count below
        self.method = "sigstop"
        self._save()
        return PauseResult("sigstop", f"SIGSTOP sent to {len(self.stopped)} process(es)", sorted(self.stopped))

    def refresh(self) -> PauseResult | None:
        """While paused: catch work that appeared since (a new process, a created slice)."""
        if self.method == "none" and self.cgroup.is_dir():
            return self.pause()
        if self.method == "sigstop":
            before = set(self.stopped)
            res = self._sigstop_all()
            if self.stopped != before:
                return res
        return None

    def resume(self) -> PauseResult:
        method = self.method or "none"
        detail = "nothing was paused"
        if method == "freeze":
            try:
                _write_existing(self.cgroup / "cgroup.freeze", b"0")
                detail = f"thawed {self.cgroup}"
            except OSError as exc:
                detail = f"could not thaw {self.cgroup}: {exc}"
        elif method == "sigstop":
            n = 0
            for pid in sorted(self.stopped):
                try:
                    os.kill(pid, signal.SIGCONT)
                    n += 1
                except (ProcessLookupError, PermissionError):
                    pass
            detail = f"SIGCONT sent to {n} process(es)"
        pids = sorted(self.stopped)
        self.method = None
        self.stopped.clear()
        self._save()
        return PauseResult(method, detail, pids)
