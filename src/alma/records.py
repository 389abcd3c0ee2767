"""Flash records: the evidence that moves a bundle from Prototype to Flashed to Booted.

``alma flash`` writes one record per attempt (success or not); ``alma verify`` and
``alma gates`` read them to derive status labels. Format: docs/formats.md#flash-record.
Records are written atomically (temp file + rename) so a crash never leaves half a record.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from almaboard.files import write_atomic as board_write_atomic

from alma.errors import ConfigError

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
    def from_dict(cls, data: dict[str, Any]) -> FlashRecord:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"not a flash record (schema {schema!r}, want {SCHEMA})")
        data = dict(data)
        try:
            data["phases"] = [Phase(**p) for p in data.get("phases", [])]
            boot = data.get("boot")
            data["boot"] = Boot(**boot) if isinstance(boot, dict) else None
            return cls(**data)
        except (TypeError, AttributeError) as exc:
            raise ConfigError(f"malformed flash record: {exc}") from exc


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` atomically and durably (temp file, fsync, rename, fsync of
    the directory): the board library's one implementation, shared with the on-board tools.

    The file keeps the mode of the file it replaces, else ``mode``, else 0644 less the
    umask (a 0600 temp file would hide committed manifests and served pages from readers).
    """
    if mode is None:
        with contextlib.suppress(FileNotFoundError):
            mode = path.stat().st_mode & 0o7777
    board_write_atomic(path, text.encode("utf-8"), durable=True, mode=mode)


def record_filename(rec: FlashRecord) -> str:
    stamp = rec.started.replace(":", "").replace("-", "").split(".")[0]
    where = str(rec.board.get("usb_instance", "unknown")).replace("/", "_")
    return f"{stamp}-{rec.machine}-{where}.json"


def save(rec: FlashRecord, directory: Path) -> Path:
    path = directory / record_filename(rec)
    write_atomic(path, json.dumps(rec.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def load_all(directory: Path) -> list[FlashRecord]:
    """Every record in ``directory``, oldest first. A malformed file is an error, not skipped."""
    if not directory.is_dir():
        return []
    out = []
    for p in sorted(directory.glob("*.json")):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
            out.append(FlashRecord.from_dict(data))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, ConfigError) as exc:
            raise ConfigError(f"{p}: {exc}", hint=f"fix or remove {p}") from exc
    return sorted(out, key=lambda r: r.started)


def status_label(bundle_sha256: str, records: list[FlashRecord]) -> str:
    """Derive the label from evidence: Prototype < Flashed < Booted."""
    mine = [r for r in records if r.bundle_sha256 == bundle_sha256]
    if any(r.booted for r in mine):
        return "Booted"
    if any(r.flashed for r in mine):
        return "Flashed"
    return "Prototype"
