"""Flash records: the evidence that moves a bundle from Prototype to Flashed to Booted.

``alma flash`` writes one record per attempt (success or not); ``alma verify`` and
``alma gates`` read them to derive status labels. Format: docs/formats.md#flash-record.
Records are written atomically (temp file + rename) so a crash never leaves half a record.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from almaboard import fields as F
from almaboard.text import terminal

from alma.errors import ConfigError
from alma.flash.pids import is_usb_instance
from alma.ground import write_atomic
from alma.loader import load_json

SCHEMA = "alma.flash-record/1"
# Where records live in the repo (committed, like the facts manifests).
DEFAULT_DIR = Path("facts") / "flash-records"

RESULTS = ("SUCCESS", "FAILED", "REFUSED", "TIMEOUT", "INTERRUPTED")


@dataclass
class Phase:
    name: str  # "prepare", "wait-board", "sign", "rcm-boot", "flash", "final-status", "boot"
    started: str  # ISO 8601 UTC
    finished: str | None = None
    result: str | None = None  # "ok" | "failed" | "timeout"


@dataclass
class Boot:
    seen: bool
    console: str | None = None
    kernel_banner: str | None = None  # the "Linux version ..." line seen on the console
    login_prompt: str | None = None  # the prompt line, e.g. "alma-orin login:"
    seen_at: str | None = None
    reason: str | None = None  # why not seen: "timeout", "unplugged", "garbage only", ...
    # the board's "alma-board: name= addr= hostkey=" console line, parsed (its pinned host key)
    board: dict[str, Any] | None = None
    # why no identity was taken from the console ("identity ambiguous: ...")
    identity_problem: str | None = None


@dataclass
class FlashRecord:
    board: dict[str, Any]  # usb_instance, vendor, product, module, soc, serial (if known)
    bundle_sha256: str
    bundle_path: str
    machine: str
    started: str
    finished: str
    result: str  # one of RESULTS
    reason: str | None = None  # one line, extracted from the log when the result is not SUCCESS
    exit_code: int | None = None  # the flash script's own exit code
    final_status: str | None = None  # "SUCCESS" | "FAILED" as printed by initrd-flash, or None
    phases: list[Phase] = field(default_factory=list)
    logs: dict[str, Any] = field(default_factory=dict)  # host_log, device_logs: [...]
    boot: Boot | None = None
    image: str | None = None
    identity: dict[str, Any] | None = None  # hostname (+ admin key) written at flash time
    # initrd-flash's own options as passed (key paths only, never their contents)
    options: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # e.g. meta-tegra's presigned-bundle warning
    tool: str = "alma flash"
    schema: str = SCHEMA

    @property
    def flashed(self) -> bool:
        return self.result == "SUCCESS" and self.final_status == "SUCCESS"

    @property
    def booted(self) -> bool:
        return self.flashed and self.boot is not None and self.boot.seen

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: F.Where | None = None) -> FlashRecord:
        """A record from its JSON, every field typed (almaboard.fields): a record edited by hand
        or written by another tool is a ConfigError naming its file, never a crash later."""
        where = where or F.in_file("flash record")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"{where(())}: not a flash record (schema {schema!r}, want {SCHEMA})")
        kw = F.check(data, _RECORD, where)
        try:
            kw["phases"] = [
                Phase(**F.check(p, _PHASE, where, prefix=("phases", str(i))))
                for i, p in enumerate(kw.get("phases", []), 1)
            ]
            if kw.get("boot") is not None:
                kw["boot"] = Boot(**F.check(kw["boot"], _BOOT, where, prefix=("boot",)))
            return cls(**kw)
        except TypeError as exc:  # a required field missing (the message names it)
            raise ConfigError(f"{where(())}: malformed flash record: {exc}") from None


_TEXT = F.string(max_len=64 * 1024)
_OPT = F.optional(_TEXT)
_PHASE: F.Schema = {"name": F.string(max_len=64), "started": _TEXT, "finished": _OPT, "result": _OPT}
_BOOT: F.Schema = {
    "seen": F.boolean(),
    "console": _OPT,
    "kernel_banner": _OPT,
    "login_prompt": _OPT,
    "seen_at": _OPT,
    "reason": _OPT,
    "board": F.optional(F.table()),
    "identity_problem": _OPT,
}
_RECORD: F.Schema = {
    "board": F.table(),
    "bundle_sha256": F.string(max_len=128),
    "bundle_path": _TEXT,
    "machine": _TEXT,
    "started": _TEXT,
    "finished": _TEXT,
    "result": F.enum(*RESULTS),
    "reason": _OPT,
    "exit_code": F.optional(F.integer(-(1 << 31), 1 << 31)),
    "final_status": _OPT,
    "phases": F.list_of(F.table()),
    "logs": F.table(),
    "boot": F.optional(F.table()),
    "image": _OPT,
    "identity": F.optional(F.table()),
    "options": F.table(),
    "warnings": F.list_of(_TEXT),
    "tool": _TEXT,
    "schema": F.enum(SCHEMA),
}


def record_filename(rec: FlashRecord) -> str:
    """``<stamp>-<machine>-<usb instance>.json``: each part only when it matched its grammar
    (a MACHINE from a bundle or a USB id from a device never chooses the path)."""
    from alma.tegraflash.names import is_machine

    stamp = "".join(c for c in rec.started.split(".")[0] if c.isascii() and c.isalnum())[:16] or "unstamped"
    machine = rec.machine if is_machine(rec.machine) else "invalid-machine"
    usb = rec.board.get("usb_instance")
    where = usb if is_usb_instance(usb) else ("unknown" if usb in (None, "") else "invalid-usb")
    return f"{stamp}-{machine}-{where}.json"


def next_path(rec: FlashRecord, directory: Path) -> Path:
    """Where ``rec`` goes; two attempts in one second get ``-2``, ``-3``... (never overwritten)."""
    path = directory / record_filename(rec)
    n = 1
    while path.exists():
        n += 1
        path = directory / f"{Path(record_filename(rec)).stem}-{n}.json"
    return path


def sanitized(obj: Any) -> Any:
    """Every string made visible-safe (controls, ESC, bidi: almaboard.text.terminal): a record
    never stores raw device or script text (raw bytes only appear as their escapes)."""
    if isinstance(obj, str):
        return terminal(obj)
    if isinstance(obj, dict):
        return {terminal(k): sanitized(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [sanitized(v) for v in obj]
    return obj


def save(rec: FlashRecord, directory: Path, path: Path | None = None) -> Path:
    path = path or next_path(rec, directory)
    if path.parent != directory:
        raise ValueError(f"a record path outside its directory: {path}")  # a bug, never input
    write_atomic(path, json.dumps(sanitized(rec.to_dict()), indent=2, sort_keys=True) + "\n")
    return path


def probe_writable(directory: Path) -> None:
    """Refuse up front (before any board is touched) when records cannot be written there."""
    import tempfile

    from alma.errors import UserError

    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-", suffix=".tmp") as fh:
            fh.write(b"{}\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise UserError(
            f"cannot write flash records to {directory}: {exc.strerror or exc}; nothing was flashed",
            hint="make it writable, or choose another place: alma flash --records-dir DIR",
        ) from exc


def load_all(directory: Path) -> list[FlashRecord]:
    """Every record in ``directory``, oldest first. A malformed file is an error, not skipped."""
    if not directory.is_dir():
        return []
    out = []
    for p in sorted(directory.glob("*.json")):
        hint = f"fix or remove {p}"
        try:
            out.append(FlashRecord.from_dict(load_json(p, hint=hint), F.in_file(p)))
        except ConfigError as exc:
            exc.hint = hint  # the next step is the same whatever is wrong inside
            raise
    return sorted(out, key=lambda r: r.started)


def status_label(bundle_sha256: str, records: list[FlashRecord]) -> str:
    """Derive the label from evidence: Prototype < Flashed < Booted."""
    mine = [r for r in records if r.bundle_sha256 == bundle_sha256]
    if any(r.booted for r in mine):
        return "Booted"
    if any(r.flashed for r in mine):
        return "Flashed"
    return "Prototype"
