"""Run a bundle's own ``initrd-flash`` for one board, with the timeouts it lacks.

meta-tegra's script (scarthgap, ``tegra-helper-scripts/initrd-flash.sh``) prints
``== Step N: <what> at <date -Is> ==`` banners, waits forever for the board and its USB
storage, and exits 0 even when the device reports ``Final status: FAILED``. Here every
banner starts a phase with its own deadline (``alma.runner.Deadline``), success needs exit
0 *and* ``Final status: SUCCESS``, and a failure carries one line saying why.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from alma import runner, settings
from alma.errors import Interrupted, ToolError, ToolTimeout, UserError
from alma.flash import reasons
from alma.flash.envfile import read_env
from alma.flash.records import Phase
from alma.ground import utc_iso

BANNER = re.compile(r"^== Step (?P<n>\d+): (?P<what>.+?) at (?P<when>\S+) ==\s*$")

# The real script's step texts -> our phase names (docs/flash.md).
STEP_PHASES = {
    "Signing binaries": "sign",
    "Boot Jetson via RCM": "rcm-boot",
    "Sending flash sequence commands": "send-commands",
    "Writing partitions on internal storage device": "flash",
    "Writing partitions on external storage device": "flash",
    "Waiting for final status from device": "final-status",
}

# Per-phase budgets in seconds. Generous: a 14 GB rootfs over USB 2.0 takes ~10 min.
DEFAULT_TIMEOUTS: dict[str, float] = {
    "wait-board": 60,
    "sign": 600,
    "rcm-boot": 300,
    "send-commands": 300,
    "flash": 3600,
    "final-status": 900,
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


@dataclass
class FlashEvent:
    usb_instance: str
    phase: str
    line: str
    banner: bool = False


class Flasher(Protocol):
    """What ``alma flash`` needs from a flash method (initrd-flash today). Setting ``cancel``
    stops a flash running in another thread (Ctrl-C during ``--all``)."""

    cancel: threading.Event

    def flash(self, bundle_dir: Path, usb_instance: str, on_event: Callable[[FlashEvent], None]) -> FlashOutcome: ...


class _CancellableDeadline(runner.Deadline):
    """A phase deadline that also expires at once when ``cancel`` is set: the runner then
    stops the tool's process group, from whichever thread runs it (KeyboardInterrupt only
    reaches the main thread)."""

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
    def __init__(
        self,
        timeouts: Mapping[str, float] | None = None,
        *,
        extra_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.extra_args = extra_args
        self.env = env
        self.cancel = threading.Event()

    def command(self, bundle_dir: Path, usb_instance: str) -> list[str]:
        configured = settings.tool("initrd-flash")
        # The bundle's own script by default: it matches the bundle's binaries.
        exe = str(bundle_dir / "initrd-flash") if configured == "initrd-flash" else configured
        return [exe, "--usb-instance", usb_instance, *self.extra_args]

    def flash(self, bundle_dir: Path, usb_instance: str, on_event: Callable[[FlashEvent], None]) -> FlashOutcome:
        phases: list[Phase] = [Phase("wait-board", utc_iso())]
        deadline = _CancellableDeadline(self.timeouts["wait-board"], "wait-board", self.cancel)
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line)
            m = BANNER.match(line.strip())
            if m:
                name = STEP_PHASES.get(m["what"], f"step-{m['n']}")
                phases[-1].finished = utc_iso()
                phases[-1].result = "ok"
                phases.append(Phase(name, utc_iso()))
                deadline.reset(self.timeouts.get(name), name)
            on_event(FlashEvent(usb_instance, phases[-1].name, line, banner=bool(m)))

        transcript = bundle_dir / "alma-initrd-flash.log"
        result = "FAILED"
        exit_code: int | None = None
        timed_out: str | None = None
        timeout_s: float | None = None
        try:
            res = runner.run(
                self.command(bundle_dir, usb_instance),
                cwd=bundle_dir,
                env=self.env,
                timeout=deadline,
                on_line=on_line,
                log_path=transcript,
                check=False,
                what="initrd-flash",
            )
            exit_code = res.returncode
        except ToolTimeout:
            if self.cancel.is_set():
                phases[-1].finished, phases[-1].result = utc_iso(), "failed"
                raise Interrupted("initrd-flash: interrupted; stopped it") from None
            timed_out, timeout_s = deadline.phase, deadline.seconds
            result = "TIMEOUT"
        except Interrupted:
            phases[-1].finished, phases[-1].result = utc_iso(), "failed"
            raise
        except ToolError as exc:  # could not start it at all
            lines.append(f"ERR: {exc.message}")
            exit_code = exc.returncode

        host_log, device_logs = collect_logs(bundle_dir)
        all_lines = list(lines)
        if host_log is not None:
            all_lines += host_log.read_text(encoding="utf-8", errors="replace").splitlines()
        status = reasons.final_status(lines)
        if result != "TIMEOUT" and exit_code == 0 and status == "SUCCESS":
            result = "SUCCESS"
        reason = None
        if result != "SUCCESS":
            reason = reasons.reason_from_log(
                all_lines,
                usb_instance=usb_instance,
                timed_out_phase=timed_out,
                timeout_s=timeout_s,
                waiting_for=_waits_for(bundle_dir, timed_out),
            )
        last = phases[-1]
        last.finished = utc_iso()
        last.result = {"SUCCESS": "ok", "TIMEOUT": "timeout"}.get(result, "failed")
        return FlashOutcome(result, reason, exit_code, status, phases, host_log, device_logs, transcript)


def _waits_for(bundle_dir: Path, phase: str | None) -> str | None:
    """The USB storage device initrd-flash waits for in ``phase`` (see initrd-flash.sh)."""
    if phase in ("send-commands", "final-status"):
        return "flashpkg"
    if phase == "flash":
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
    """Copy the host log, device logs and our transcript next to the flash record."""
    out: dict[str, object] = {"host_log": None, "device_logs": []}
    if not any((outcome.host_log, outcome.device_logs, outcome.transcript)):
        return out
    dest.mkdir(parents=True, exist_ok=True)
    if outcome.host_log is not None:
        shutil.copy2(outcome.host_log, dest / outcome.host_log.name)
        out["host_log"] = str(dest / outcome.host_log.name)
    if outcome.device_logs is not None:
        target = dest / outcome.device_logs.name
        shutil.copytree(outcome.device_logs, target, dirs_exist_ok=True)
        out["device_logs"] = sorted(str(p) for p in target.rglob("*") if p.is_file())
    if outcome.transcript is not None and outcome.transcript.exists():
        shutil.copy2(outcome.transcript, dest / outcome.transcript.name)
        out["transcript"] = str(dest / outcome.transcript.name)
    return out
