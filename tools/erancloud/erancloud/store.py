"""JetStream as ERANCLOUD's only store (the engine ERAN-GRID already uses).

* KV bucket ``ERANCLOUD`` (file storage), written by the coordinator alone: ``state`` (the
  round state, one JSON row, updated compare-and-set on its revision), ``worker.<id>`` (the
  registry), ``verdict.<round>.<id>`` (the coordinator's answer), ``round.<r>``.
* KV bucket ``ERANCLOUD_PUSH``: ``push.<round>.<id>`` (a worker's push record, created once).
  Every worker writes here, so it is apart from the coordinator's rows: a worker creating
  push rows for round after round fills at most this bucket, never the one the round state
  lives in, and the bucket drops its oldest rows when full (discard "old"), so a flood cannot
  lock the honest workers out either (the coordinator reads each push as it arrives).
  ``Store`` picks the bucket from the key: callers name keys only.
* Object Store ``ERANCLOUD_OBJ``: ``model.<round>``, ``momentum.<round>``, ``shard.<n>``,
  ``delta.<round>.<id>.<sha12>`` (blobs, wire.py).
* Object Store ``ERANCLOUD_D_<id>``: one per worker, the only place that worker may write a
  blob (its deltas); the coordinator copies an accepted delta into ``ERANCLOUD_OBJ``.
* Subject ``erancloud.v1.register.<id>``: request/reply served by the coordinator.

Every bucket is created with limits (bytes, value size, per-worker TTL): a peer cannot fill
the server's disk through them. With the shipped server config (auth.py) the server also
decides who may write which key and bucket.

Objects are read chunk by chunk with JetStream direct gets (``_chunks``), never through a
consumer: the workers' role then needs no right to create consumers (which it could create
without end), and an object that is a link into another bucket is refused, not followed.

nats-py is imported only here. Every call is bounded by a timeout; nats-py reconnects with a
bounded backoff, an ``Outage`` lets callers ride out a bounded outage, and any transport
failure past it is a ``CoordinatorUnreachable`` with the URL and the cause (connection
refused, authorization, timeout), never a traceback. Credentials never appear in a message.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadBlob, CoordinatorUnreachable, UserError

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.js import api
except ImportError as exc:  # pragma: no cover - exercised where nats-py is missing
    raise UserError("eran-cloud needs nats-py to talk to a coordinator", hint="pip install nats-py") from exc

KV_BUCKET = "ERANCLOUD"
OBJ_BUCKET = "ERANCLOUD_OBJ"
KV_VALUE_MAX = 64 * 1024  # our rows are small JSON; anything bigger is refused on read
# Limits set when the buckets are created (a bucket made by an older coordinator keeps its own).
KV_MAX_BYTES = 64 * 1024 * 1024
PUSH_BUCKET = "ERANCLOUD_PUSH"
PUSH_PREFIX = "push."
PUSH_VALUE_MAX = 4 * 1024  # a push record is ~400 bytes of JSON
PUSH_MAX_BYTES = 16 * 1024 * 1024  # ~40k records: a flood evicts its own rows long before an unread honest one
OBJ_MAX_BYTES = 128 * 1024 * 1024  # ~50 rounds of models, momenta and deltas of a 2.4k model: ~10 MB
INBOX_MAX_BYTES = 4 * 1024 * 1024  # a worker's own bucket: a few deltas in flight
INBOX_TTL = 3600.0  # seconds; the coordinator copies what it accepts, the rest may go
RECONNECT_WAIT = 0.5  # nats-py's pause between reconnect attempts (it adds jitter): bounded backoff

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError, asyncio.TimeoutError, nats.errors.Error)
TIMEOUTS: tuple[type[BaseException], ...] = (asyncio.TimeoutError, nats.errors.TimeoutError)


@dataclass(frozen=True)
class Creds:
    """A user name and password on the NATS server (``eran-cloud coordinator issue-worker``
    writes them, mode 0600). The worker's identity on the bus is this user."""

    user: str
    password: str

    @classmethod
    def load(cls, path: Path) -> Creds:
        try:
            st = path.stat()
            raw = path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read the credential file {path}: {exc.strerror}") from exc
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(
                f"the credential file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o})",
                hint=f"chmod 600 {path}",
            )
        row = parse_row(raw)
        if row is None or not isinstance(row.get("user"), str) or not isinstance(row.get("password"), str):
            raise UserError(f"{path} is not an eran-cloud credential file (JSON with user and password)")
        return cls(row["user"], row["password"])

    def __repr__(self) -> str:  # never the password, not even in a traceback
        return f"Creds(user={self.user!r})"


class Disconnected(ConnectionError):
    """nats-py says the connection is down (it is reconnecting)."""


def redact_url(url: str) -> str:
    """``url`` without its userinfo (``nats://user:secret@host`` -> ``nats://***@host``):
    a password in a URL must never reach a message."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"


def _cause(exc: BaseException | None) -> str:
    """A reader's name for a transport failure."""
    if exc is None or isinstance(exc, Disconnected):
        return "no answer"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    text = str(exc).strip()
    if "authorization" in text.lower() or "permissions" in text.lower():
        return f"refused by the server: {text[:200]}"
    if isinstance(exc, nats.errors.NoServersError | nats.errors.TimeoutError | asyncio.TimeoutError | TimeoutError):
        return "timed out"
    return f"{exc.__class__.__name__} {text[:200]}".strip()


class Store:
    def __init__(
        self,
        url: str,
        timeout: float = 5.0,
        name: str = "eran-cloud",
        creds: Creds | None = None,
        identity: str | None = None,
    ) -> None:
        self.url = url
        # Replies come to an inbox under this name: the credential's user (the server lets it
        # subscribe to nothing else, auth.py), or on a server without auth the worker id, so
        # the coordinator's reply check (protocol.reply_subject_ok) holds there too.
        self.identity = creds.user if creds is not None else identity
        self.timeout = timeout
        self.name = name
        self.creds = creds
        self.nc: Any = None
        self.js: Any = None
        self.kv: Any = None
        self.pushes: Any = None  # the ERANCLOUD_PUSH bucket (push.* keys)
        self.obj: Any = None
        self.inboxes: dict[str, Any] = {}
        self.last_error: BaseException | None = None  # what nats-py last reported (error_cb)
        self.reconnected = False

    def cause(self, exc: BaseException | None = None) -> str:
        main = _cause(exc)
        if self.last_error is not None and self.last_error is not exc and main in ("timed out", "no answer"):
            return f"{_cause(self.last_error)}; {main}"
        return main

    def unreachable(self, exc: BaseException, what: str = "") -> CoordinatorUnreachable:
        return CoordinatorUnreachable(f"NATS at {redact_url(self.url)}{what}: {self.cause(exc)}")

    @property
    def connected(self) -> bool:
        return self.nc is not None and bool(self.nc.is_connected)

    async def connect(self, create: bool = False, buckets: bool = True) -> None:
        """Connect and open (``create``: make) the buckets. A worker never creates them: a
        missing bucket means no coordinator has ever run here. ``buckets=False``: the
        connection alone (the coordinator's replies, which may touch no bucket)."""
        auth: dict[str, Any] = {}
        if self.identity is not None:
            auth["inbox_prefix"] = f"_INBOX.{self.identity}"
        if self.creds is not None:
            auth.update(user=self.creds.user, password=self.creds.password)
        try:
            self.nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    connect_timeout=self.timeout,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=RECONNECT_WAIT,
                    name=self.name,
                    error_cb=self._error,
                    disconnected_cb=self._noop,
                    reconnected_cb=self._reconnected,
                    **auth,
                ),
                timeout=self.timeout,
            )
            self.js = self.nc.jetstream(timeout=self.timeout)
            if not buckets:
                return
            if create:
                self.kv = await self._kv_bucket()
                self.pushes = await self._push_bucket()
                self.obj = await self._obj_bucket()
            else:
                self.kv = await self.js.key_value(KV_BUCKET)
                self.pushes = await self.js.key_value(PUSH_BUCKET)
                self.obj = await self.js.object_store(OBJ_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError) as exc:
            await self.close()
            raise CoordinatorUnreachable(
                f"NATS at {redact_url(self.url)} has no {KV_BUCKET} buckets: no coordinator has run there",
                hint="start one: eran-cloud coordinator --nats URL",
            ) from exc
        except TRANSPORT_ERRORS as exc:
            await self.close()
            raise self.unreachable(exc) from exc

    async def _kv_bucket(self) -> Any:
        try:
            return await self.js.key_value(KV_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            return await self.js.create_key_value(
                bucket=KV_BUCKET, storage=api.StorageType.FILE, history=1, max_value_size=KV_VALUE_MAX,
                max_bytes=KV_MAX_BYTES,
            )  # fmt: skip

    async def _push_bucket(self) -> Any:
        try:
            await self.js.key_value(PUSH_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            await self.js.create_key_value(
                bucket=PUSH_BUCKET, storage=api.StorageType.FILE, history=1, max_value_size=PUSH_VALUE_MAX,
                max_bytes=PUSH_MAX_BYTES,
            )  # fmt: skip
        # Checked on every start, so a bucket an older coordinator made is brought up to date.
        # nats-py makes every KV bucket discard "new" when full: here the oldest rows go.
        # Rollup headers are refused: every worker publishes into this stream, and one
        # publish with "Nats-Rollup: all" on its own key once purged every worker's push.
        info = await self.js.stream_info(f"KV_{PUSH_BUCKET}")
        if info.config.discard != api.DiscardPolicy.OLD or info.config.allow_rollup_hdrs:
            info.config.discard = api.DiscardPolicy.OLD
            info.config.allow_rollup_hdrs = False
            await self.js.update_stream(info.config)
        return await self.js.key_value(PUSH_BUCKET)

    async def _obj_bucket(self) -> Any:
        try:
            return await self.js.object_store(OBJ_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            return await self.js.create_object_store(
                OBJ_BUCKET, config=api.ObjectStoreConfig(storage=api.StorageType.FILE, max_bytes=OBJ_MAX_BYTES)
            )

    async def inbox(self, worker: str, create: bool = False) -> Any:
        """The worker's own Object Store bucket (``create``: the coordinator makes it, with a
        size limit and a TTL, when the worker registers)."""
        from .protocol import inbox_bucket

        bucket = inbox_bucket(worker)
        if bucket not in self.inboxes:
            try:
                self.inboxes[bucket] = await self.js.object_store(bucket)
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
                if not create:
                    raise
                cfg = api.ObjectStoreConfig(storage=api.StorageType.FILE, max_bytes=INBOX_MAX_BYTES, ttl=INBOX_TTL)
                self.inboxes[bucket] = await self.js.create_object_store(bucket, config=cfg)
        return self.inboxes[bucket]

    async def _error(self, exc: Exception) -> None:
        # Reconnects are nats-py's job; our calls time out and name this cause. A refusal by the
        # server (authorization) is kept over the connection resets that follow it.
        if self.last_error is None or "authorization" not in str(self.last_error).lower():
            self.last_error = exc

    async def _noop(self) -> None:
        pass

    async def _reconnected(self) -> None:
        self.reconnected = True

    async def close(self) -> None:
        """Close the connection; never raises (nats-py's close can fail in odd ways while the
        server is away: a TypeError was seen; the process is ending either way)."""
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), timeout=self.timeout)

    # -- KV -------------------------------------------------------------------------------
    def _kv(self, key: str) -> Any:
        """The bucket a key lives in: push records in ERANCLOUD_PUSH, the rest in ERANCLOUD."""
        return self.pushes if key.startswith(PUSH_PREFIX) else self.kv

    async def get_json(self, key: str) -> tuple[dict[str, Any] | None, int]:
        """(row, revision); (None, 0) when absent. A row that is not a small JSON object is
        reported as absent-with-revision so the caller can overwrite it."""
        try:
            entry = await self._kv(key).get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, nats.js.errors.NotFoundError):
            return None, 0
        return parse_row(entry.value), int(entry.revision or 0)

    async def put_json(self, key: str, row: dict[str, Any]) -> int:
        return int(await self._kv(key).put(key, dump_row(row)))

    async def create_json(self, key: str, row: dict[str, Any]) -> bool:
        """True when created; False when the key exists already (create-only: exactly once)."""
        try:
            await self._kv(key).create(key, dump_row(row))
            return True
        except nats.js.errors.KeyWrongLastSequenceError:
            return False

    async def update_json(self, key: str, row: dict[str, Any], revision: int) -> int:
        """Compare-and-set on ``revision``: the new revision, or 0 when someone else wrote in between."""
        try:
            return int(await self._kv(key).update(key, dump_row(row), last=revision))
        except nats.js.errors.KeyWrongLastSequenceError:
            return 0

    async def delete(self, key: str, *, no_marker: bool = False) -> None:
        """Remove ``key``. A KV purge leaves a marker of about the row's size; ``no_marker``
        removes it with the JetStream API instead (for rows pruned by the thousand, whose
        markers would otherwise fill the bucket as the rows did)."""
        if key.startswith(PUSH_PREFIX) or no_marker:
            # A KV purge is a rollup header, which the push stream refuses: the API instead
            # (only the coordinator has the right to call it on that stream).
            bucket = PUSH_BUCKET if key.startswith(PUSH_PREFIX) else KV_BUCKET
            await self.js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")
            return
        with contextlib.suppress(nats.js.errors.KeyNotFoundError, nats.js.errors.NotFoundError):
            await self._kv(key).purge(key)

    async def keys(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (which ends in "."). A watcher on that subject, not kv.keys():
        nats-server < 2.10 ignores kv.keys()'s filters."""
        watcher = await self._kv(prefix).watch(f"{prefix}>", headers_only=True, ignore_deletes=True)
        found: list[str] = []
        try:
            while True:
                entry = await watcher.updates(timeout=self.timeout)
                if entry is None:  # the end of what is stored now
                    break
                found.append(entry.key)
                if entry.delta == 0:
                    break
        finally:
            await watcher.stop()
        return sorted(set(found))

    # -- objects --------------------------------------------------------------------------
    async def _bucket(self, bucket: str | None) -> Any:
        if bucket is None:
            return self.obj
        return await self.inbox(bucket.removeprefix("ERANCLOUD_D_"))

    async def put_blob(self, name: str, blob: bytes, bucket: str | None = None) -> None:
        await (await self._bucket(bucket)).put(name, blob)

    async def get_blob(self, name: str, max_bytes: int | None = None, bucket: str | None = None) -> bytes | None:
        """The object's bytes; None when there is none; BadBlob when it is larger than
        ``max_bytes`` (checked on its metadata, before a byte of it is fetched). JetStream's own chunk digest failing is
        reported as a bad blob, like any other corruption."""
        try:
            info = await (await self._bucket(bucket)).get_info(name)
            if info.is_link():  # nats-py would follow it into another bucket
                raise BadBlob("object store: a link to another object, not an object")
            size = int(info.size or 0)
            if max_bytes is not None and size > max_bytes:
                raise BadBlob(f"{size} bytes, more than the {max_bytes} a blob of this kind can be")
            if not info.nuid or not str(info.digest or "").upper().startswith("SHA-256="):
                raise BadBlob("object store: BadObjectMetaError")
            return await self._chunks(bucket or OBJ_BUCKET, str(info.nuid), size, str(info.digest)[8:])
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError, nats.js.errors.ObjectDeletedError):
            return None
        except nats.js.errors.BadObjectMetaError as exc:
            raise BadBlob(f"object store: {exc.__class__.__name__}") from exc

    async def _chunks(self, bucket: str, nuid: str, size: int, digest: str) -> bytes:
        """An object's chunks, read one by one with direct gets (``next_by_subj``), never
        more than its metadata's ``size``, checked against its SHA-256. nats-py's own reader
        creates a consumer per read: a right the server then has to grant every worker, and
        a worker holding it could create consumers without end (300 durable ones in 5 s,
        tried against the shipped config)."""
        subject, stream = f"$O.{bucket}.C.{nuid}", f"OBJ_{bucket}"
        data, seq = bytearray(), 0
        while len(data) < size:
            msg = await self.js.get_msg(stream, seq=seq + 1, subject=subject, next=True, direct=True)
            data += msg.data or b""
            seq = int(msg.seq or 0)
            if seq <= 0:
                raise BadBlob("object store: a chunk without a sequence number")
        if len(data) != size:
            raise BadBlob(f"object store: {len(data)} bytes of chunks, the metadata says {size}")
        try:
            want = base64.urlsafe_b64decode(digest.encode() + b"=" * (-len(digest) % 4))
        except ValueError as exc:
            raise BadBlob("object store: BadObjectMetaError") from exc
        if hashlib.sha256(data).digest() != want:
            raise BadBlob("object store: DigestMismatchError")
        return bytes(data)

    async def delete_blob(self, name: str, bucket: str | None = None) -> None:
        with contextlib.suppress(
            nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError, nats.js.errors.ObjectDeletedError
        ):
            await (await self._bucket(bucket)).delete(name)

    async def blob_names(self) -> list[str]:
        try:
            return [info.name for info in await self.obj.list()]
        except nats.js.errors.NotFoundError:
            return []


def dump_row(row: dict[str, Any]) -> bytes:
    return json.dumps(row, sort_keys=True, separators=(",", ":")).encode()


def parse_row(value: bytes | None) -> dict[str, Any] | None:
    """A KV row as a JSON object, or None for anything else (empty, too big, not JSON, a list)."""
    if not value or len(value) > KV_VALUE_MAX:
        return None
    try:
        row = json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return None
    return row if isinstance(row, dict) else None


class Outage:
    """Rides out NATS being away for up to ``window`` seconds (monotonic): calls fail, the
    caller reports them here and tries again; past the window the program fails closed
    (exit 4) with the URL and the cause."""

    def __init__(self, store: Store, window: float, log: Callable[[str], None], pause: float = 0.25) -> None:
        self.store, self.window, self.log, self.pause = store, window, log, pause
        self.since: float | None = None

    def over(self) -> None:
        if self.since is not None:
            self.log(f"NATS at {self.store.url} is back after {time.monotonic() - self.since:.1f} s")
            self.since = None

    async def failed(self, exc: BaseException, what: str = "") -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.log(f"NATS at {self.store.url}{what}: {self.store.cause(exc)}; retrying for up to {self.window:g} s")
        if now - self.since >= self.window:
            raise self.store.unreachable(exc, f" unreachable for {now - self.since:.0f} s{what}") from exc
        await asyncio.sleep(self.pause)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``path`` so a reader sees the old or the new content, never half of it, and so a
    power loss keeps one of them (file and directory fsync'd). The temp file is unique
    (O_EXCL) and 0600 from its first byte; ``mode`` is set before the rename.

    ERANCLOUD's one atomic write: a copy of almaboard.files.write_atomic kept on purpose, as
    erancloud ships without the board library (see errors.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte."""
    write_atomic(path, data, mode=0o600)
