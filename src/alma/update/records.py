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
_STR = ("node", "run", "swu_sha256", "swu_version", "machine", "started")
_OPT_STR = ("reason", "finished", "from_version", "boot_id", "log")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def _problem(data: dict[str, Any], path: Path) -> str | None:
    """Why ``data`` (a record read back, maybe edited by hand or by something else) is not one
    we wrote; None when it is. Its node and .swu must be the file's own: they make the path
    the record is saved to again."""
    for k in _STR:
        if not isinstance(data.get(k), str):
            return f"{k} is not a string"
    for k in _OPT_STR:
        if data.get(k) is not None and not isinstance(data[k], str):
            return f"{k} is not a string"
    sha = data["swu_sha256"]
    if data["node"] != path.stem or not _SHA.fullmatch(sha) or sha[:16] != path.parent.name:
        return "node or .swu does not match the record's own path"
    if data.get("result") not in RESULTS:
        return f"unknown result {str(data.get('result'))[:40]!r}"
    for k in ("from_slot", "to_slot"):
        if data.get(k) not in (None, "a", "b"):
            return f"{k} is not a or b"
    if not isinstance(data.get("wave", 0), int) or isinstance(data.get("wave"), bool):
        return "wave is not a number"
    for k in ("capsule", "health"):
        if data.get(k) is not None and not isinstance(data[k], dict):
            return f"{k} is not a table"
    bw = data.get("baseline_warnings", [])
    if not isinstance(bw, list) or not all(isinstance(x, str) for x in bw):
        return "baseline_warnings is not a list of names"
    phases = data.get("phases", [])
    if not isinstance(phases, list):
        return "phases is not a list"
    for ph in phases:
        if not isinstance(ph, dict) or ph.get("name") not in PHASES or not isinstance(ph.get("started"), str):
            return "a phase is not one alma update writes"
        if ph.get("result") not in (None, "ok", "failed", "timeout", "interrupted"):
            return "a phase has an unknown result"
        d = ph.get("duration_s")
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1e9):
            return "a phase has a bad duration"
        if any(ph.get(k) is not None and not isinstance(ph[k], str) for k in ("finished", "detail")):
            return "a phase has non-text fields"
    return None


def load(path: Path) -> UpdateRecord:
    """A record read back and checked (``_problem``): a hand-edited or foreign file is a
    ConfigError naming it, never a crash or a path elsewhere."""
    hint = "delete it to start this board over"
    data = load_json(path, hint=hint)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not an {SCHEMA} record", hint=hint)
    why = _problem(data, path)
    if why is not None:
        raise ConfigError(f"{path} is not a record alma update wrote: {why}", hint=hint)
    try:
        phases = [Phase(**p) for p in data.pop("phases", [])]
        return UpdateRecord(**data, phases=phases)
    except TypeError as exc:
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
