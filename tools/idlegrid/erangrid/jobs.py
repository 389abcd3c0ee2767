"""What a job is, how its checkpoint travels, and the backend interface both queues implement."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .errors import UserError

# The job id grammar (docs/eran-grid.md, "Job identity"): the one check between queue text and
# any path, subject or key built from it. '.' and '..' match the characters but name directories.
JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def job_id_problem(job_id: object) -> str:
    """'' when ``job_id`` is a usable job id, else why not (for the dead-letter detail)."""
    if not isinstance(job_id, str):
        return f"job id must be text, not {type(job_id).__name__}"
    if not JOB_ID.fullmatch(job_id) or job_id in (".", ".."):
        return f"job id {job_id[:80]!r} does not match [A-Za-z0-9._-]{{1,64}} (and is not '.' or '..')"
    return ""


def job_dir(state_dir: Path, job_id: str) -> Path:
    """``state_dir/work/<id>``: the only way a job's directory is named (the id checked first)."""
    why = job_id_problem(job_id)
    if why:
        raise UserError(f"refusing to build a path from an unchecked job id: {why}")
    return state_dir / "work" / job_id


@dataclass
class Job:
    """A command with its input, an optional checkpoint and, at the end, a result."""

    id: str
    command: list[str]
    input: bytes = b""
    name: str = ""
    checkpoint: bool = True  # give the job a checkpoint directory that survives requeues
    yields: int = 0
    failures: int = 0
    attempts: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "command": self.command,
            "input": base64.b64encode(self.input).decode(),
            "name": self.name,
            "checkpoint": self.checkpoint,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=str(data["id"]),
            command=[str(a) for a in data["command"]],
            input=base64.b64decode(data.get("input", "")),
            name=str(data.get("name", "")),
            checkpoint=bool(data.get("checkpoint", True)),
        )


def parse_job(data: bytes, fallback_id: str) -> tuple[Job, str]:
    """A queued message as a Job, and '' — or a placeholder Job and why it cannot run (queue
    entries are hostile input: any program with access to the queue may have written them)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return Job(id=fallback_id, command=[]), f"not JSON: {data[:60]!r}"
    if not isinstance(obj, dict):
        return Job(id=fallback_id, command=[]), f"not a JSON object: {str(obj)[:60]}"
    raw_id = obj.get("id", fallback_id)
    why = job_id_problem(raw_id)
    if why:  # the placeholder carries the queue's own id: the dead letter needs a valid key
        return Job(id=fallback_id, command=[]), why
    job_id = str(raw_id)
    command = obj.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        return Job(id=job_id, command=[]), f"command must be a non-empty list of non-empty strings, not {command!r:.60}"
    try:
        return Job.from_json(obj), ""
    except (TypeError, ValueError, KeyError) as exc:
        return Job(id=job_id, command=[]), f"unusable job: {exc}"


def validate_command(command: list[str]) -> None:
    if not command or not all(isinstance(a, str) and a for a in command):
        raise UserError(
            "a job needs a command: a non-empty list of non-empty arguments",
            hint="try: eran-grid submit -- python3 examples/hashchain.py --steps 1000000",
        )


@dataclass
class Lease:
    """A claimed job. ``token`` proves ownership to the backend; ``handle`` is backend data."""

    job: Job
    token: str
    checkpoint: bytes | None = None  # packed checkpoint from the last attempt
    handle: Any = field(default=None, repr=False)


@dataclass
class Outcome:
    status: str  # "done" | "dead"
    result: bytes
    exit_code: int | None
    detail: str = ""


class Backend(Protocol):
    """The queue as the agent sees it. SQLite and NATS JetStream implement it; the agent's
    code is the same for both."""

    def open(self, node: str) -> int: ...  # connect; release our own stale leases; returns how many
    def ping(self) -> None: ...  # raises CoordinatorUnreachable
    def claim(self, node: str) -> Lease | None: ...
    def heartbeat(self, lease: Lease, checkpoint: bytes | None) -> bool: ...  # False: lease lost
    def complete(self, lease: Lease, outcome: Outcome) -> bool: ...
    def yield_(self, lease: Lease, checkpoint: bytes | None) -> None: ...
    def fail(self, lease: Lease, error: str, checkpoint: bytes | None) -> str: ...  # "queued"|"dead"
    def close(self) -> None: ...


# -- checkpoints: a flat directory of regular files, packed as JSON so it can ride in a
#    SQLite row or a JetStream KV entry. Names are checked on the way in: nothing can escape.


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\x00" not in name and not name.startswith(".") and name not in ("..",)


def pack_checkpoint(directory: Path, max_bytes: int) -> bytes | None:
    """The checkpoint directory as bytes, or None when it is empty. Half-written files (names
    starting with '.' or ending in '.tmp') are skipped: jobs write a temp file and rename.

    The directory and its files are the job's: a symlink is never followed, neither for a file
    nor for the directory itself (a job can swap ``checkpoint`` for a link to the agent's
    credentials); everything is opened relative to the directory's own descriptor."""
    files: dict[str, str] = {}
    total = 0
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP/ENOTDIR: a symlink or a file where the directory was
        raise UserError(f"checkpoint {directory} is not a directory ({exc.strerror}): not packed") from None
    try:
        with os.scandir(dfd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if not _safe_name(entry.name) or entry.name.endswith(".tmp") or not entry.is_file(follow_symlinks=False):
                continue
            try:  # O_NOFOLLOW: a job may swap a file for a symlink to the agent's own files
                fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as fh:
                data = fh.read(max_bytes - total + 1)
            total += len(data)
            if total > max_bytes:
                raise UserError(
                    f"checkpoint in {directory} is larger than {max_bytes} bytes",
                    hint="raise checkpoint_max_bytes or make the job's checkpoint smaller",
                )
            files[entry.name] = base64.b64encode(data).decode()
    finally:
        os.close(dfd)
    if not files:
        return None
    return json.dumps({"files": files}, sort_keys=True).encode()


def unpack_checkpoint(blob: bytes | None, directory: Path) -> int:
    """Write a packed checkpoint into an empty ``directory``; returns the number of files."""
    directory.mkdir(parents=True, exist_ok=True)
    if not blob:
        return 0
    try:
        packed = json.loads(blob)
        files = packed["files"] if isinstance(packed, dict) else None
    except (ValueError, KeyError) as exc:
        raise UserError(f"unreadable checkpoint: {exc}") from exc
    if not isinstance(files, dict):
        raise UserError("checkpoint is not a mapping of file names to contents")
    for name, data in files.items():
        if not _safe_name(name) or not isinstance(data, str):
            raise UserError(f"refusing checkpoint file {name!r}")
        tmp = directory / f".{name}.part"
        try:
            tmp.write_bytes(base64.b64decode(data))
            os.replace(tmp, directory / name)
        except (OSError, ValueError) as exc:  # e.g. a name too long for the filesystem, bad base64
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise UserError(f"cannot restore checkpoint file {name[:40]!r}: {exc}") from exc
    return len(files)
