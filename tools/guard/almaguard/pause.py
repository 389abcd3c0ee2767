"""Pausing and resuming the work: cgroup v2 ``cgroup.freeze``, SIGSTOP/SIGCONT as fallback.

Never kills: the only signals sent are SIGSTOP and SIGCONT. A guard restarted after a
crash (or kill -9) adopts a pause it did not make itself from the machine (a frozen cgroup,
stopped processes in the slice), so a lost or unwritable ``/run/alma-guard/paused.json``
cannot leave the work stopped forever; the record only adds what the machine cannot say.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from almaboard.files import read_json, read_text, write_json


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


def stop_pending(proc: Path, pid: int) -> bool:
    """A SIGSTOP sent and not yet acted on: the process shows T only once it is scheduled,
    which on a loaded board can be after the guard that sent it was killed."""
    bit = 1 << (signal.SIGSTOP - 1)
    for line in (read_text(proc / str(pid) / "status") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd"):
            with contextlib.suppress(ValueError):
                if int(value.strip(), 16) & bit:
                    return True
    return False


def _stopped(proc: Path, pid: int) -> bool:
    # Pending first: the kernel dequeues a SIGSTOP and sets T under one lock, so a stop not
    # pending any more shows T at the later state read. State first, the worker could stop
    # between the reads and look runnable with nothing pending.
    return stop_pending(proc, pid) or proc_state(proc, pid) == "T"


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


def frozen(cgroup: Path) -> bool:
    """The cgroup is frozen or freezing: ``cgroup.freeze`` is 1, or ``cgroup.events`` says
    ``frozen 1`` (an ancestor froze it)."""
    if (read_text(cgroup / "cgroup.freeze") or "0") == "1":
        return True
    events = read_text(cgroup / "cgroup.events") or ""
    return any(line.split() == ["frozen", "1"] for line in events.splitlines())


class Pauser:
    """Pause/resume every process in one cgroup (a systemd slice).

    What is paused is learnt from the machine, not from a file: at start the cgroup's
    ``cgroup.freeze``/``cgroup.events`` and every process of the slice in state T (job-control
    stop; a ptrace stop reads ``t`` and is left alone) or with a SIGSTOP still pending.
    ``paused.json`` only adds pids it recorded that are still stopped. A record that cannot be written is reported
    (``record_error``), never raised: the pause itself has already happened.
    """

    def __init__(self, cgroup: Path, record: Path, proc: Path = Path("/proc")) -> None:
        self.cgroup = cgroup
        self.record = record
        self.proc = proc
        self.method: str | None = None
        self.stopped: set[int] = set()
        self.record_error = ""
        self.thaw_error = ""  # a thaw that failed: the pause stands until a retry succeeds
        self.recorded_zones: dict[str, str] = {}  # zone name -> path, from a previous guard's record
        self._adopt()

    # -- what a previous guard left paused (from the machine first) ----------------------
    def _adopt(self) -> None:
        rec = read_json(self.record)
        rec = rec if isinstance(rec, dict) and rec.get("cgroup") == str(self.cgroup) else {}
        zones = rec.get("zones")
        if isinstance(zones, dict):
            self.recorded_zones = {str(k): str(v) for k, v in zones.items()}
        recorded = {int(p) for p in rec.get("pids", []) if isinstance(p, int)}
        stopped = {pid for pid in _cgroup_pids(self.cgroup) if _stopped(self.proc, pid)}
        stopped |= {pid for pid in recorded if _stopped(self.proc, pid)}
        self.stopped = stopped
        if frozen(self.cgroup) or rec.get("method") == "freeze":
            self.method = "freeze"
        elif stopped:
            self.method = "sigstop"
        elif rec.get("method") == "none":
            self.method = "none"

    def _save(self) -> None:
        try:
            if self.method is None:
                with contextlib.suppress(FileNotFoundError):
                    self.record.unlink()
            else:
                write_json(
                    self.record,
                    {
                        "cgroup": str(self.cgroup),
                        "method": self.method,
                        "pids": sorted(self.stopped),
                        "zones": self.recorded_zones,
                    },
                    durable=False,
                )
        except OSError as exc:
            self.record_error = f"cannot write {self.record}: {exc.strerror or exc}"
        else:
            self.record_error = ""

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
        except OSError as exc:
            why = errno.errorcode.get(exc.errno or 0, str(exc))
        else:
            self.thaw_error = ""
            self.method = "freeze"
            self._save()
            return PauseResult("freeze", f"froze {self.cgroup}")
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
        self.retry_record()
        return None

    def retry_record(self) -> None:
        """Write the record again if the last write failed (the state dir may be back)."""
        if self.record_error:
            self._save()

    def remember_zones(self, zones: dict[str, str]) -> None:
        """Zones to recreate if a later guard finds them gone (a vanished zone stays unreadable)."""
        if zones != self.recorded_zones:
            self.recorded_zones = dict(zones)
            if self.method is not None:
                self._save()

    def resume(self) -> PauseResult:
        """Thaw and continue what we paused. A thaw write that fails (EBUSY, EIO) keeps the
        pause recorded (``thaw_error``; the guard retries with backoff): forgetting it would
        strand the work frozen with nobody trying again."""
        method = self.method or "none"
        parts: list[str] = []
        self.thaw_error = ""
        if method == "freeze" or frozen(self.cgroup):
            try:
                _write_existing(self.cgroup / "cgroup.freeze", b"0")
                parts.append(f"thawed {self.cgroup}")
            except FileNotFoundError:
                parts.append(f"{self.cgroup} is gone: nothing to thaw")
            except OSError as exc:
                why = errno.errorcode.get(exc.errno or 0, str(exc))
                self.thaw_error = f"could not thaw {self.cgroup} ({why})"
                parts.append(self.thaw_error)
        if self.stopped:
            n = 0
            for pid in sorted(self.stopped):
                try:
                    os.kill(pid, signal.SIGCONT)
                    n += 1
                except (ProcessLookupError, PermissionError):
                    pass
            parts.append(f"SIGCONT sent to {n} process(es)")
        pids = sorted(self.stopped)
        self.method = "freeze" if self.thaw_error else None
        self.stopped.clear()
        self._save()
        return PauseResult(method, "; ".join(parts) or "nothing was paused", pids)
