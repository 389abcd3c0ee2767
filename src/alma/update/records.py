"""Update records: one JSON file per board per ``.swu``, the evidence and the resume point.

Same style as flash records (src/alma/flash/records.py): phases with timings and results,
one final result with a one-line reason, the remote logs kept beside it; written atomically
after every phase, so a crash or Ctrl-C leaves the last completed phase on disk and the next
``alma update`` of the same ``.swu`` resumes from it (format: docs/formats.md#update-record).

Layout: ``<records>/<swu sha256[:16]>/<node>.json`` + ``<node>.log`` + ``campaign.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from almaboard import fields as F

from alma.errors import ConfigError, UserError
from alma.ground import parse_utc, utc_iso, utc_now, write_atomic
from alma.loader import load_json

SCHEMA = "alma.update-record/1"
# Final results: the board is in a known, stable state and nothing more will be done.
COMMITTED = "COMMITTED"  # running the new version, marked successful
CURRENT = "CURRENT"  # was already running this version
ROLLED_BACK = "ROLLED_BACK"  # the new slot failed; the board runs its old slot again
FAILED = "FAILED"  # refused or failed before the switch: the board runs its old slot; the same command tries again
SKIPPED = "SKIPPED"  # not attempted: the run stopped after too many failures
# Not final: the next run resumes.
LOST = "LOST"  # the board did not come back within the deadline: state unknown
INTERRUPTED = "INTERRUPTED"  # Ctrl-C / crash: resume
IN_PROGRESS = "IN_PROGRESS"
FINAL = (COMMITTED, CURRENT, ROLLED_BACK, FAILED, SKIPPED)
GOOD = (COMMITTED, CURRENT)


def default_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "alma" / "update"


@dataclass
class Phase:
    name: str  # check, lock, push, install, reboot, wait, health, commit, rollback
    started: str
    finished: str | None = None
    duration_s: float | None = None
    result: str | None = None  # ok | failed | timeout | interrupted
    detail: str | None = None


@dataclass
class UpdateRecord:
    node: str
    run: str
    swu_sha256: str
    swu_version: str
    machine: str
    started: str
    result: str = IN_PROGRESS
    reason: str | None = None
    finished: str | None = None
    wave: int = 0
    from_slot: str | None = None
    to_slot: str | None = None
    from_version: str | None = None
    boot_id: str | None = None  # the board's boot id before the reboot into the new slot
    capsule: dict[str, Any] | None = None
    baseline_warnings: list[str] = field(default_factory=list)
    health: dict[str, Any] | None = None
    phases: list[Phase] = field(default_factory=list)
    log: str | None = None
    schema: str = SCHEMA

    @property
    def final(self) -> bool:
        return self.result in FINAL

    def last_ok(self) -> str | None:
        done = [p.name for p in self.phases if p.result == "ok"]
        return done[-1] if done else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def campaign_dir(root: Path, swu_sha256: str) -> Path:
    return root / swu_sha256[:16]


def record_path(root: Path, swu_sha256: str, node: str) -> Path:
    return campaign_dir(root, swu_sha256) / f"{node}.json"


def save(root: Path, rec: UpdateRecord) -> Path:
    import json

    path = record_path(root, rec.swu_sha256, rec.node)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(rec.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


RESULTS = (*FINAL, LOST, INTERRUPTED, IN_PROGRESS)
PHASES = ("check", "lock", "push", "install", "reboot", "wait", "health", "commit", "rollback")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_TEXT = F.string(max_len=64 * 1024)
_OPT = F.optional(_TEXT)
_SLOT = F.optional(F.enum("a", "b"))
# Every field typed (almaboard.fields): a record edited by hand or by something else is refused
# naming its file, never a crash or a path elsewhere.
_RECORD: F.Schema = {
    **{k: _TEXT for k in ("node", "run", "swu_sha256", "swu_version", "machine", "started")},
    **{k: _OPT for k in ("reason", "finished", "from_version", "boot_id", "log")},
    "result": F.enum(*RESULTS),
    "wave": F.integer(0, 1_000_000),
    "from_slot": _SLOT,
    "to_slot": _SLOT,
    "capsule": F.optional(F.table()),
    "health": F.optional(F.table()),
    "baseline_warnings": F.list_of(F.string(max_len=256), max_items=4096),
    "phases": F.list_of(F.table(), max_items=len(PHASES) * 64),
    "schema": F.enum(SCHEMA),
}
_PHASE: F.Schema = {
    "name": F.enum(*PHASES),
    "started": _TEXT,
    "finished": _OPT,
    "duration_s": F.optional(F.number(0.0, 1e9)),
    "result": F.optional(F.enum("ok", "failed", "timeout", "interrupted")),
    "detail": _OPT,
}
_REQUIRED = ("node", "run", "swu_sha256", "swu_version", "machine", "started")


def load(path: Path) -> UpdateRecord:
    """A record read back and checked: a hand-edited or foreign file is a ConfigError naming
    it, never a crash or a path elsewhere. Its node and .swu must be the file's own: they make
    the path the record is saved to again."""
    hint = "delete it to start this board over"
    data = load_json(path, hint=hint)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not an {SCHEMA} record", hint=hint)
    where = F.in_file(path)
    kw = F.check(data, _RECORD, where, hint=hint)
    missing = [k for k in _REQUIRED if k not in kw]
    if missing:
        raise ConfigError(f"{path}: not a record alma update wrote: {', '.join(missing)} missing", hint=hint)
    sha = kw["swu_sha256"]
    if kw["node"] != path.stem or not _SHA.fullmatch(sha) or sha[:16] != path.parent.name:
        raise ConfigError(
            f"{path} is not a record alma update wrote: node or .swu does not match the record's own path", hint=hint
        )
    try:
        kw["phases"] = [
            Phase(**F.check(p, _PHASE, where, prefix=("phases", str(i)), hint=hint))
            for i, p in enumerate(kw.get("phases", []), 1)
        ]
        return UpdateRecord(**kw)
    except TypeError as exc:  # a phase without name or started
        raise ConfigError(f"{path}: {exc}", hint=hint) from None


def load_existing(root: Path, swu_sha256: str, node: str) -> UpdateRecord | None:
    path = record_path(root, swu_sha256, node)
    return load(path) if path.exists() else None


# A record older than this (its last phase's start) no longer marks its board mid-update: an
# abandoned run must not mask a real CRITICAL forever (run the same command again to resume).
MID_UPDATE_MAX_S = 12 * 3600


def updating(root: Path | None = None, *, now: datetime | None = None) -> dict[str, str]:
    """node -> "phase since" for every board some record shows mid-update (for fleet health):
    IN_PROGRESS, INTERRUPTED or LOST, its last phase started within MID_UPDATE_MAX_S of now."""
    root = root or default_dir()
    now = now or utc_now()
    out: dict[str, str] = {}
    if not root.is_dir():
        return out
    for path in root.glob("*/*.json"):
        if path.name == "campaign.json":
            continue
        try:
            rec = load(path)
        except (UserError, OSError):
            continue
        if rec.result in (IN_PROGRESS, INTERRUPTED, LOST) and rec.phases:
            p = rec.phases[-1]
            try:
                age = (now - parse_utc(p.started)).total_seconds()
            except ValueError:
                continue
            if abs(age) <= MID_UPDATE_MAX_S:  # nor one dated far ahead (a clock jump)
                out[rec.node] = f"update to {rec.swu_version} {rec.result.lower()} in phase {p.name} since {p.started}"
    return out


class CampaignLock:
    """One ``alma update`` process per ``.swu`` on this desktop (flock, released on exit)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / ".lock"
        self._fh: IO[str] | None = None

    def __enter__(self) -> CampaignLock:
        fh = self.path.open("w")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise UserError(
                f"another alma update of this .swu is running on this desktop (lock {self.path})",
                hint="wait for it to finish, or stop it with Ctrl-C; then run the same command to resume",
            ) from None
        self._fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()


def now() -> str:
    return utc_iso()
