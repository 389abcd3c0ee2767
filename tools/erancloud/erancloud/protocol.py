"""Protocol version 1: names of keys and objects, and the checks on every message and row.

Everything a peer sends is judged here, by one function per kind, which returns the reason
for a refusal (a short sentence) or the cleaned value. docs/erancloud.md lists the fields.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from . import PROTOCOL

WORKER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
# What a worker may say about itself: how it computes, nothing about who owns it or where it is.
CAPABILITIES = {"cpus": int, "python": str, "numpy": str, "arch": str, "protocol": int}


def model_key(round_no: int) -> str:
    return f"model.{round_no}"


def momentum_key(round_no: int) -> str:
    return f"momentum.{round_no}"


def shard_key(n: int) -> str:
    return f"shard.{n}"


def push_key(round_no: int, worker: str) -> str:
    return f"push.{round_no}.{worker}"


def verdict_key(round_no: int, worker: str) -> str:
    return f"verdict.{round_no}.{worker}"


def round_key(round_no: int) -> str:
    return f"round.{round_no}"


def reference_key(round_no: int) -> str:
    """The coordinator's own update of a round (the ``reference`` aggregate's yardstick)."""
    return f"reference.{round_no}"


def content_key(values_sha: str) -> str:
    """The duplicate-delta guard's row: one per accepted delta, named by its values' sha256."""
    return f"content.{values_sha}"


def contents_key(round_no: int) -> str:
    """The index of the ``content.*`` rows of the deltas applied in a round (for pruning)."""
    return f"contents.{round_no}"


def delta_object(round_no: int, worker: str, sha: str) -> str:
    return f"delta.{round_no}.{worker}.{sha[:12]}"


# A worker registers on its own subject: with the shipped server config (auth.py) the server
# lets user W publish only to ``erancloud.v1.register.W``, so the subject is its identity.
REGISTER_PREFIX = "erancloud.v1.register"


def register_subject(worker: str) -> str:
    return f"{REGISTER_PREFIX}.{worker}"


def worker_from_subject(subject: str) -> str | None:
    head, _, worker = subject.rpartition(".")
    return worker if head == REGISTER_PREFIX and WORKER_ID.match(worker) else None


# nats-py's inbox: "<prefix>.<nuid>" for a single request, "<prefix>.<nuid>.<token>" for its
# multiplexed one; a worker's prefix is "_INBOX.<its id>" (store.py), the only inbox its
# server permissions let it subscribe to.
_INBOX_TAIL = re.compile(r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,2}$")


def reply_subject_ok(reply: str, worker: str) -> bool:
    """True when ``reply`` is an inbox of ``worker`` itself: the only subject the coordinator
    answers a registration on (a reply subject is the requester's text; answering anywhere
    else would be writing there on the worker's behalf)."""
    head = f"_INBOX.{worker}."
    return WORKER_ID.match(worker) is not None and reply.startswith(head) and bool(_INBOX_TAIL.match(reply[len(head):]))


def inbox_bucket(worker: str) -> str:
    """The worker's own Object Store bucket, the only place it may write blobs (its deltas)."""
    return f"ERANCLOUD_D_{worker}"


def parse_push_key(key: str) -> tuple[int, str] | None:
    parts = key.split(".")
    if len(parts) != 3 or parts[0] != "push" or not parts[1].isdigit() or not WORKER_ID.match(parts[2]):
        return None
    return int(parts[1]), parts[2]


def check_registration(worker: str | None, req: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | str:
    """(worker id, capabilities) or the reason for refusing. ``worker`` comes from the subject
    the request arrived on (the server's identity of the sender), never from the body."""
    if worker is None:
        return "the worker id must be 1-64 characters of A-Z a-z 0-9 _ -"
    if req is None:
        return "the registration is not a JSON object"
    if req.get("v") != PROTOCOL:
        return f"protocol version {req.get('v')!r} is not spoken here (this coordinator speaks {PROTOCOL})"
    extra = set(req) - {"v", "worker", "capabilities"}
    if extra:
        return f"the registration carries unknown fields {sorted(extra)}"
    if "worker" in req and req["worker"] != worker:
        return "the registration names another worker than the subject it was sent on"
    caps = req.get("capabilities", {})
    if not isinstance(caps, dict):
        return "capabilities must be a JSON object"
    for key, value in caps.items():
        kind = CAPABILITIES.get(key)
        if kind is None:
            return (
                f"capability {str(key)[:40]!r} is not accepted: only {sorted(CAPABILITIES)} "
                "(nothing about the device's owner or surroundings)"
            )
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, str) and len(value) > 32):
            return f"capability {key!r} must be a short {kind.__name__}"
        if isinstance(value, int) and not 0 <= value <= 4096:
            return f"capability {key!r} out of range"
    return worker, dict(caps)


def push_record(
    worker: str, round_no: int, base_sha: str, obj: str, sha: str, samples: int, steps: int
) -> dict[str, Any]:
    return {
        "v": PROTOCOL,
        "worker": worker,
        "round": round_no,
        "base_sha256": base_sha,
        "object": obj,
        "sha256": sha,
        "samples": samples,
        "steps": steps,
        "pushed": time.time(),
    }


def check_push(record: dict[str, Any] | None, round_no: int, worker: str) -> str | None:
    """The reason a push record is malformed, or None. (Round and model checks come after.)"""
    if record is None:
        return "the push record is not a JSON object"
    if record.get("v") != PROTOCOL:
        return f"protocol version {record.get('v')!r}, expected {PROTOCOL}"
    if record.get("worker") != worker or record.get("round") != round_no:
        return "the push record's worker/round do not match its key"
    for field in ("base_sha256", "sha256"):
        if not isinstance(record.get(field), str) or not HEX64.match(record[field]):
            return f"field {field!r} is not a sha256"
    obj = record.get("object")
    if not isinstance(obj, str) or obj != delta_object(round_no, worker, record["sha256"]):
        return "the delta object is not named delta.<round>.<worker>.<sha12>"
    for field in ("samples", "steps"):
        value = record.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 10_000_000:
            return f"field {field!r} is not a positive integer"
    return None


# What a worker accepts from the round state before it trains: bounds that keep a lying
# state from making it train forever, allocate gigabytes or divide by nothing.
TRAIN_LIMITS: dict[str, tuple[float, float]] = {
    "h": (1, 1_000_000),
    "lr": (1e-6, 10.0),
    "batch": (1, 4096),
    "hidden": (1, 4096),
    "seed": (0, 2**31),
    "inputs": (1, 4096),
    "classes": (2, 255),
}


def check_state(row: dict[str, Any]) -> str | None:
    """The reason a round state is unusable for a worker, or None."""
    r = row.get("round")
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        return "round is not a non-negative integer"
    if not isinstance(row.get("model_sha256"), str) or not HEX64.match(row["model_sha256"]):
        return "model_sha256 is not a sha256"
    train = row.get("train")
    if not isinstance(train, dict):
        return "train is not an object"
    for key, (low, high) in TRAIN_LIMITS.items():
        value = train.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            return f"train.{key} = {str(value)[:20]!r} is outside [{low:g}, {high:g}]"
        if key != "lr" and not isinstance(value, int):
            return f"train.{key} is not an integer"
    from .inner import check_train

    return check_train(train)


def _int(value: Any, low: int = 0, high: int = 2**62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_worker_row(key: str, row: dict[str, Any] | None, shards_n: int) -> str | None:
    """The reason a registry row read back from the store is unusable, or None."""
    worker = key.removeprefix("worker.")
    if not WORKER_ID.match(worker) or key != f"worker.{worker}":
        return "malformed key"
    if row is None:
        return "not a small JSON object"
    if row.get("v") != PROTOCOL or row.get("worker") != worker:
        return "version or worker does not match its key"
    if not _int(row.get("shard"), 0, shards_n - 1):
        return f"shard {str(row.get('shard'))[:20]!r} is not one of the {shards_n} shards"
    for field in ("registered_round", "seen_round"):
        if not _int(row.get(field)):
            return f"{field} {str(row.get(field))[:20]!r} is not a round number"
    if not isinstance(row.get("capabilities", {}), dict):
        return "capabilities is not an object"
    return None


def check_coordinator_state(row: dict[str, Any] | None) -> str | None:
    """The reason the round state cannot be resumed from, or None: every field the
    coordinator reads, typed (a row someone tampered with stops it with this reason, never
    with a traceback)."""
    if row is None:
        return "it is not a small JSON object"
    if row.get("v") != PROTOCOL:
        return f"protocol version {str(row.get('v'))[:20]!r}"
    bad = check_state(row)
    if bad:
        return bad
    if row.get("phase") not in ("open", "finished"):
        return "phase is not open/finished"
    for field in ("rounds", "min_deltas", "shards_n", "live_window"):
        if not _int(row.get(field), 1, 1_000_000):
            return f"{field} is not a positive integer"
    for field in ("round_timeout", "opened", "deadline"):
        if not _num(row.get(field)):
            return f"{field} is not a number"
    if not _num(row.get("quorum_share", 0.0)) or not 0.0 <= row.get("quorum_share", 0.0) <= 1.0:
        return "quorum_share is not a share in [0, 1]"
    if not isinstance(row.get("momentum_sha256"), str) or not HEX64.match(row["momentum_sha256"]):
        return "momentum_sha256 is not a sha256"
    shards = row.get("shards")
    if (
        not isinstance(shards, list)
        or len(shards) != row["shards_n"]
        or not all(isinstance(s, str) and HEX64.match(s) for s in shards)
    ):
        return "shards is not one sha256 per shard"
    hist = row.get("model_history")
    if not isinstance(hist, dict) or not all(
        isinstance(k, str) and k.isdigit() and isinstance(v, str) and HEX64.match(v) for k, v in hist.items()
    ):
        return "model_history is not round -> sha256"
    last = row.get("last_push")
    if not isinstance(last, dict) or not all(WORKER_ID.match(str(k)) and _int(v) for k, v in last.items()):
        return "last_push is not worker -> round"
    applied = row.get("applied")
    if not isinstance(applied, dict) or not all(
        parse_push_key(f"push.{k}") is not None and isinstance(v, str) and HEX64.match(v) for k, v in applied.items()
    ):
        return "applied is not round.worker -> sha256"
    acc = row.get("accuracy")
    if not isinstance(acc, list) or not all(
        isinstance(a, list) and len(a) == 3 and _int(a[0]) and _num(a[1]) and _int(a[2]) for a in acc
    ):
        return "accuracy is not a list of [round, accuracy, deltas]"
    if not isinstance(row.get("rejected"), dict) or not isinstance(row.get("outliers", {}), dict):
        return "rejected/outliers is not an object"
    outer = row.get("outer")
    if not isinstance(outer, dict):
        return "outer is not an object"
    try:
        from .outer import Outer

        Outer.from_json(outer)
    except (KeyError, TypeError, ValueError) as exc:
        return f"outer: {str(exc)[:80]}"
    return None
