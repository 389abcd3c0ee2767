"""Run a bundle's own ``initrd-flash`` for one board, with the timeouts it lacks.

meta-tegra's script (scarthgap, ``tegra-helper-scripts/initrd-flash.sh``) prints
``== Step N: <what> at <date -Is> ==`` banners, waits forever for the board and its USB
storage, and exits 0 even when the device reports ``Final status: FAILED``. Here every
protocol step (alma.flash.protocol) starts a phase with its own deadline
(``alma.runner.Deadline``), success needs exit 0 *and* ``Final status: SUCCESS``, and a
failure carries one line saying why. A cancel (Ctrl-C, SIGTERM) stops the script's
process group and returns an INTERRUPTED outcome with its logs, like any other outcome.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from almaboard import text as T

from alma import runner, settings
from alma.errors import ToolError, ToolTimeout, UserError
from alma.flash import privilege, reasons
from alma.flash.protocol import PHASES, Tracker
from alma.flash.records import Phase
from alma.ground import utc_iso
from alma.tegraflash.envfile import read_env

# Per-phase budgets in seconds. Generous where the work is long (a 14 GB rootfs over USB 2.0
# takes ~10 min), short where a wait means the board is not coming (flashpkg, storage).
DEFAULT_TIMEOUTS: dict[str, float] = {
    "wait-board": 60,
    "sign": 600,
    "rcm-boot": 300,
    "flashpkg": 120,
    "send-commands": 300,
    "storage": 180,
    "flash": 3600,
    "final-status": 900,
}
assert tuple(DEFAULT_TIMEOUTS) == PHASES
# initrd-flash prints "Waiting for USB storage device X from S..." without a newline and a
# dot every 5 s: hand the unfinished line over once the script has been quiet this long.
PARTIAL_AFTER_S = 0.5
# A stopped initrd-flash (timeout, Ctrl-C, SIGTERM) gets this long after SIGTERM before its
# whole process group is killed: bounded, so every board has its record well within 5 s.
STOP_GRACE_S = 4.0
STOP_CAUSE = "Ctrl-C or SIGTERM"  # what sets cancel unless the caller says otherwise (the flash service)
TRANSCRIPT = "alma-initrd-flash.log"  # alma's own copy of the script's output, next to its logs
PRESIGNED_WARNING = "WARN: binaries already signed; ignoring signing options"


@dataclass
class FlashArgs:
    """initrd-flash's own options (passed through, recorded; key *paths* only, never contents)."""

    erase_nvme: bool = False
    skip_bootloader: bool = False
    pkc_key: Path | None = None  # -u
    sbk_key: Path | None = None  # -v

    def argv(self) -> list[str]:
        out: list[str] = []
        if self.erase_nvme:
            out.append("--erase-nvme")
        if self.skip_bootloader:
            out.append("--skip-bootloader")
        if self.pkc_key is not None:
            out += ["-u", str(self.pkc_key)]
        if self.sbk_key is not None:
            out += ["-v", str(self.sbk_key)]
        return out

    def check(self) -> None:
        for flag, key in (("-u", self.pkc_key), ("-v", self.sbk_key)):
            if key is not None and not Path(key).is_file():
                raise UserError(
                    f"signing key {flag} {key}: not a readable file", hint="pass the path of the key file itself"
                )

    def record(self) -> dict[str, object]:
        return {
            "erase_nvme": self.erase_nvme,
            "skip_bootloader": self.skip_bootloader,
            "pkc_key": str(self.pkc_key) if self.pkc_key else None,
            "sbk_key": str(self.sbk_key) if self.sbk_key else None,
        }


@dataclass
class FlashOutcome:
    result: str  # SUCCESS | FAILED | TIMEOUT | INTERRUPTED
    reason: str | None
    exit_code: int | None
    final_status: str | None
    phases: list[Phase] = field(default_factory=list)
    host_log: Path | None = None
    device_logs: Path | None = None
    transcript: Path | None = None
    tracker: Tracker | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class FlashEvent:
    usb_instance: str
    phase: str
    line: str
    banner: bool = False


class _CancellableDeadline(runner.Deadline):
    """A phase deadline that also expires at once when ``cancel`` is set: the runner then
    stops the tool's process group, from whichever thread runs it."""

    def __init__(self, seconds: float | None, phase: str, cancel: threading.Event) -> None:
        super().__init__(seconds, phase)
        self.cancel = cancel

    def remaining(self) -> float | None:
        return 0.0 if self.cancel.is_set() else super().remaining()  # the runner polls every 0.2 s

    def expired(self) -> bool:
        if self.cancel.is_set():
            return True
        rem = super().remaining()
        return rem is not None and rem <= 0


class InitrdFlasher:
    """The flash method of ``alma flash`` (initrd-flash). Setting ``cancel`` stops every flash
    running in any thread; ``kill_all`` stops them without grace; ``stop_cause`` is what set
    ``cancel``, for the record's reason."""

    def __init__(
        self,
        timeouts: Mapping[str, float] | None = None,
        *,
        args: FlashArgs | None = None,
        env: Mapping[str, str] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.args = args or FlashArgs()
        self.env = env
        self.cancel = cancel or threading.Event()
        self._pids: set[int] = set()
        self._pids_lock = threading.Lock()
        self.stop_cause = STOP_CAUSE
        self._program: privilege.CheckedProgram | None = None
        self._checked = False

    def check(self) -> None:
        """A configured initrd-flash (alma.toml, ALMA_TOOL_INITRD_FLASH) is trusted and hashed
        now (alma.flash.privilege, invariant 4); the bundle's own is checked per board copy."""
        if self._checked:
            return
        configured = settings.tool("initrd-flash")
        if configured != "initrd-flash":
            found = configured if "/" in configured else shutil.which(configured)
            if found is None:
                raise UserError(f"initrd-flash tool {configured!r} not found in PATH", hint="fix [tools] in alma.toml")
            self._program = privilege.CheckedProgram.of(
                Path(found), "initrd-flash tool", "point [tools] initrd-flash at a program only root can write"
            )
        self._checked = True

    def command(self, bundle_dir: Path, usb_instance: str) -> list[str]:
        self.check()
        # The bundle's own script by default: it matches the bundle's binaries.
        exe = str(bundle_dir / "initrd-flash") if self._program is None else str(self._program.path)
        return [exe, "--usb-instance", usb_instance, *self.args.argv()]

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        with self._pids_lock:
            self._pids.add(proc.pid)

    def kill_all(self) -> None:
        """A second Ctrl-C: no grace for the scripts (the runner still reaps them)."""
        with self._pids_lock:
            pids = list(self._pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def _run_script(
        self,
        argv: list[str],
        bundle_dir: Path,
        deadline: _CancellableDeadline,
        on_line: Callable[[str], None],
        lines: list[str],
        transcript: Path,
        pass_fds: tuple[int, ...],
    ) -> tuple[str, int | None, str | None, float | None]:
        """Run the flash script to its end, its timeout or a stop: (result so far, its exit
        code, the phase that timed out and that phase's limit). A script that could not start
        at all adds its error to ``lines``."""
        result = "FAILED"
        exit_code: int | None = None
        timed_out: str | None = None
        timeout_s: float | None = None
        pid_box: list[int] = []

        def started(proc: subprocess.Popen[bytes]) -> None:
            pid_box.append(proc.pid)
            self._started(proc)

        if self._program is not None:
            self._program.reverify()  # the inode and bytes that were checked, right before the exec
        try:
            res = runner.run(
                argv,
                cwd=bundle_dir,
                env=self.env,
                timeout=deadline,
                on_line=on_line,
                log_path=transcript,
                check=False,
                what="initrd-flash",
                flush_partial_after=PARTIAL_AFTER_S,
                on_start=started,
                stop_grace=STOP_GRACE_S,
                pass_fds=pass_fds,
            )
            exit_code = res.returncode
        except ToolTimeout:
            if self.cancel.is_set():
                result = "INTERRUPTED"
            else:
                timed_out, timeout_s = deadline.phase, deadline.seconds
                result = "TIMEOUT"
        except ToolError as exc:  # could not start it at all
            lines.append(f"ERR: {exc.message}")
            exit_code = exc.returncode
        finally:
            with self._pids_lock:
                self._pids.difference_update(pid_box)
        if result == "FAILED" and self.cancel.is_set():
            result = "INTERRUPTED"  # it ended while being stopped
        return result, exit_code, timed_out, timeout_s

    def flash(
        self,
        bundle_dir: Path,
        usb_instance: str,
        on_event: Callable[[FlashEvent], None],
        *,
        pass_fds: tuple[int, ...] = (),
    ) -> FlashOutcome:
        """``pass_fds``: the board's lock and the run's, held by the flasher itself while it runs
        (a killed alma's flasher keeps the board locked and its run dir alive: alma.flash.leftovers)."""
        phases: list[Phase] = [Phase("wait-board", utc_iso())]
        deadline = _CancellableDeadline(self.timeouts["wait-board"], "wait-board", self.cancel)
        lines: list[str] = []
        warnings: list[str] = []

        def on_phase(name: str) -> None:
            phases[-1].finished = utc_iso()
            phases[-1].result = "ok"
            phases.append(Phase(name, utc_iso()))
            deadline.reset(self.timeouts.get(name), name)

        tracker = Tracker(on_phase)

        def on_line(raw: str) -> None:
            line = T.terminal(raw)  # the one sanitizer: display, reasons and records see this
            lines.append(line)
            banner = tracker.feed(line)
            if line.strip() == PRESIGNED_WARNING and PRESIGNED_WARNING not in warnings:
                warnings.append(PRESIGNED_WARNING)
            on_event(FlashEvent(usb_instance, phases[-1].name, line, banner=banner))

        transcript = transcript_path(bundle_dir)
        _create_private(transcript)  # alma's own file, new, outside the bundle's tree
        result, exit_code, timed_out, timeout_s = self._run_script(
            self.command(bundle_dir, usb_instance), bundle_dir, deadline, on_line, lines, transcript, pass_fds
        )

        host_log, device_logs = collect_logs(bundle_dir)
        all_lines = list(lines)
        if host_log is not None:
            all_lines += [T.terminal(x) for x in host_log.read_text(encoding="utf-8", errors="replace").splitlines()]
        status = reasons.final_status(lines)
        if result == "FAILED" and exit_code == 0 and status == "SUCCESS":
            result = "SUCCESS"
        reason = None
        if result == "INTERRUPTED":
            reason = f"interrupted ({self.stop_cause}) in phase {phases[-1].name}; initrd-flash was stopped"
        elif result != "SUCCESS":
            reason = reasons.reason_from_log(
                all_lines,
                usb_instance=usb_instance,
                timed_out_phase=timed_out,
                timeout_s=timeout_s,
                waiting_for=_waits_for(bundle_dir, timed_out),
                device_logs=device_logs is not None and any(device_logs.iterdir()),
                erase_nvme=self.args.erase_nvme,
            )
        last = phases[-1]
        last.finished = utc_iso()
        last.result = {"SUCCESS": "ok", "TIMEOUT": "timeout", "INTERRUPTED": "interrupted"}.get(result, "failed")
        return FlashOutcome(
            result, reason, exit_code, status, phases, host_log, device_logs, transcript, tracker, warnings
        )


def transcript_path(bundle_dir: Path) -> Path:
    """alma's transcript of a board's flash: next to the board's copy, never inside it (the
    bundle's tree is the bundle's: a member may be a link that a write would follow)."""
    return bundle_dir.parent / f"{bundle_dir.name}.{TRANSCRIPT}"


def _create_private(path: Path) -> None:
    """``path`` created new through its directory's descriptor: never a link, never an old file."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.close(os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd))  # fmt: skip
    finally:
        os.close(dfd)


def _waits_for(bundle_dir: Path, phase: str | None) -> str | None:
    """The USB storage device initrd-flash waits for in ``phase`` (see initrd-flash.sh)."""
    if phase in ("flashpkg", "final-status"):
        return "flashpkg"
    if phase == "storage":
        try:
            return read_env(bundle_dir).rootfs_device or None
        except UserError:
            return None
    return None


def collect_logs(bundle_dir: Path) -> tuple[Path | None, Path | None]:
    """The newest ``log.initrd-flash.<stamp>`` and ``device-logs-<stamp>/`` the script left."""
    logs = sorted(bundle_dir.glob("log.initrd-flash.*"), key=lambda p: p.stat().st_mtime)
    devs = sorted((p for p in bundle_dir.glob("device-logs-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return (logs[-1] if logs else None), (devs[-1] if devs else None)


def keep_logs(outcome: FlashOutcome, dest: Path) -> dict[str, object]:
    """Move the host log, device logs and our transcript next to the flash record.

    Moved, not copied (a rename when both are on one filesystem: it needs no space), and a
    half-written copy across filesystems is removed while its source stays: on a full disk
    the evidence is still in the board's work dir (the caller keeps it and says where).
    """
    out: dict[str, object] = {"host_log": None, "device_logs": []}
    if not any((outcome.host_log, outcome.device_logs, outcome.transcript)):
        return out
    dest.mkdir(parents=True, exist_ok=True)
    if outcome.host_log is not None:
        out["host_log"] = str(_move(outcome.host_log, dest / outcome.host_log.name))
    if outcome.device_logs is not None:
        target = _move(outcome.device_logs, dest / outcome.device_logs.name)
        out["device_logs"] = sorted(str(p) for p in target.rglob("*") if p.is_file())
    if outcome.transcript is not None and outcome.transcript.exists():
        out["transcript"] = str(_move(outcome.transcript, dest / TRANSCRIPT))
    return out


def _move(src: Path, dst: Path) -> Path:
    try:
        os.rename(src, dst)
        return dst
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    try:
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
            shutil.rmtree(src)
        else:
            shutil.copy2(src, dst)
            src.unlink()
    except OSError:
        with contextlib.suppress(OSError):
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()  # never a 0-byte "log"
        raise
    return dst
