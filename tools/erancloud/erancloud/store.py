"""JetStream as ERANCLOUD's only store (the engine ERAN-GRID already uses).

* KV bucket ``ERANCLOUD`` (file storage): ``state`` (the round state, one JSON row, updated
  compare-and-set on its revision), ``worker.<id>`` (the registry), ``push.<round>.<id>``
  (a worker's push record, created once), ``verdict.<round>.<id>`` (the coordinator's answer).
* Object Store ``ERANCLOUD_OBJ``: ``model.<round>``, ``momentum.<round>``, ``shard.<n>``,
  ``delta.<round>.<id>.<sha12>`` (blobs, wire.py).
* Subject ``erancloud.v1.register``: request/reply served by the coordinator.

nats-py is imported only here. Every call is bounded by a timeout; any transport failure is
a ``CoordinatorUnreachable`` with the URL and the cause, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
REGISTER_SUBJECT = "erancloud.v1.register"
KV_VALUE_MAX = 64 * 1024  # our rows are small JSON; anything bigger is refused on read

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError, asyncio.TimeoutError, nats.errors.Error)


class Store:
    def __init__(self, url: str, timeout: float = 5.0, name: str = "eran-cloud") -> None:
        self.url = url
        self.timeout = timeout
        self.name = name
        self.nc: Any = None
        self.js: Any = None
        self.kv: Any = None
        self.obj: Any = None

    def unreachable(self, exc: BaseException) -> CoordinatorUnreachable:
        return CoordinatorUnreachable(f"NATS at {self.url}: {exc.__class__.__name__} {exc}".strip())

    async def connect(self, create: bool = False) -> None:
        """Connect and open (``create``: make) the buckets. A worker never creates them: a
        missing bucket means no coordinator has ever run here."""
        try:
            self.nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    connect_timeout=self.timeout,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                    name=self.name,
                    error_cb=self._quiet,
                    disconnected_cb=self._noop,
                    reconnected_cb=self._noop,
                ),
                timeout=self.timeout,
            )
            self.js = self.nc.jetstream(timeout=self.timeout)
            if create:
                self.kv = await self._kv_bucket()
                self.obj = await self._obj_bucket()
            else:
                self.kv = await self.js.key_value(KV_BUCKET)
                self.obj = await self.js.object_store(OBJ_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError) as exc:
            await self.close()
            raise CoordinatorUnreachable(
                f"NATS at {self.url} has no {KV_BUCKET} buckets: no coordinator has run there",
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
                bucket=KV_BUCKET, storage=api.StorageType.FILE, history=1, max_value_size=KV_VALUE_MAX
            )

    async def _obj_bucket(self) -> Any:
        try:
            return await self.js.object_store(OBJ_BUCKET)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
            return await self.js.create_object_store(OBJ_BUCKET, storage=api.StorageType.FILE)

    async def _quiet(self, exc: Exception) -> None:
        pass  # reconnects are nats-py's job; our calls time out and report

    async def _noop(self) -> None:
        pass

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await asyncio.wait_for(self.nc.close(), timeout=self.timeout)

    # -- KV -------------------------------------------------------------------------------
    async def get_json(self, key: str) -> tuple[dict[str, Any] | None, int]:
        """(row, revision); (None, 0) when absent. A row that is not a small JSON object is
        reported as absent-with-revision so the caller can overwrite it."""
        try:
            entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, nats.js.errors.NotFoundError):
            return None, 0
        return parse_row(entry.value), int(entry.revision or 0)

    async def put_json(self, key: str, row: dict[str, Any]) -> int:
        return int(await self.kv.put(key, dump_row(row)))

    async def create_json(self, key: str, row: dict[str, Any]) -> bool:
        """True when created; False when the key exists already (create-only: exactly once)."""
        try:
            await self.kv.create(key, dump_row(row))
            return True
        except nats.js.errors.KeyWrongLastSequenceError:
            return False

    async def update_json(self, key: str, row: dict[str, Any], revision: int) -> int:
        """Compare-and-set on ``revision``: the new revision, or 0 when someone else wrote in between."""
        try:
            return int(await self.kv.update(key, dump_row(row), last=revision))
        except nats.js.errors.KeyWrongLastSequenceError:
            return 0

    async def delete(self, key: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError, nats.js.errors.NotFoundError):
            await self.kv.purge(key)

    async def keys(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (which ends in "."). A watcher on that subject, not kv.keys():
        nats-server < 2.10 ignores kv.keys()'s filters."""
        watcher = await self.kv.watch(f"{prefix}>", headers_only=True, ignore_deletes=True)
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
    async def put_blob(self, name: str, blob: bytes) -> None:
        await self.obj.put(name, blob)

    async def get_blob(self, name: str, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes; None when there is none; BadBlob when it is larger than
        ``max_bytes`` (checked on its metadata, before a byte of it is fetched). JetStream's own chunk digest failing is
        reported as a bad blob, like any other corruption."""
        try:
            if max_bytes is not None:
                size = int((await self.obj.get_info(name)).size or 0)
                if size > max_bytes:
                    raise BadBlob(f"{size} bytes, more than the {max_bytes} a blob of this kind can be")
            return bytes((await self.obj.get(name)).data)
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError, nats.js.errors.ObjectDeletedError):
            return None
        except (nats.js.errors.DigestMismatchError, nats.js.errors.BadObjectMetaError) as exc:
            raise BadBlob(f"object store: {exc.__class__.__name__}") from exc

    async def delete_blob(self, name: str) -> None:
        with contextlib.suppress(
            nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError, nats.js.errors.ObjectDeletedError
        ):
            await self.obj.delete(name)

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
