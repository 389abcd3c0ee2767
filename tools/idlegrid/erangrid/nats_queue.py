"""The fleet queue: NATS JetStream, an existing engine instead of a home-made coordinator.

* Jobs: a work-queue stream (``retention=workqueue``, file storage), one durable pull consumer
  shared by every node, explicit acks, ``AckWait`` = the lease: a node that dies mid-job stops
  acking and JetStream redelivers the job to another node.
* Heartbeats are ``+WPI`` (in-progress) acks; a yield is a ``-NAK`` (redeliver now); a job
  finished (or dead-lettered) is acked after its result is stored.
* Results: their own stream, one subject per job, published with
  ``Nats-Expected-Last-Subject-Sequence: 0`` so the server accepts exactly one result per job
  even when a redelivered copy also finishes.
* Checkpoints and yield/failure counters: a JetStream key-value bucket (values ≤ ~1 MiB).
* "Release our own leases at start": the ack subjects this node holds are kept in the bucket;
  a restarted node NAKs them at once instead of waiting for AckWait.

nats-py is imported only here, and this module only when ``queue.backend = "nats"``. The
agent is synchronous; the client runs on an asyncio loop in one background thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from .credentials import QueueCredentials, redact
from .errors import CoordinatorUnreachable, UserError
from .jobs import Job, Lease, Outcome, parse_job, validate_command

try:
    import nats
    from nats.js import api
    from nats.js.errors import APIError, BadRequestError, FetchTimeoutError, NotFoundError
except ImportError as exc:  # pragma: no cover - exercised on images without nats-py
    raise UserError("the NATS backend needs nats-py", hint='install nats-py, or set queue.backend = "sqlite"') from exc

T = TypeVar("T")
KV_VALUE_MAX = 1024 * 1024 - 4096  # JetStream's default max payload is 1 MiB


def _key(job_id: str) -> str:
    """A job id (or node name) as one subject token / KV key part, one-to-one: '_' becomes
    '_5F' and '.' '_2E' (a token may not hold '.'). Mapping '.' to '_' alone let "a.b" and
    "a_b" share one result subject, checkpoint and counters: the first result stood for both."""
    return job_id.replace("_", "_5F").replace(".", "_2E")


class NatsQueue:
    def __init__(
        self,
        url: str,
        stream: str = "ERANGRID",
        max_failures: int = 3,
        lease_ttl: float = 30.0,
        connect_timeout: float = 2.0,
        fetch_timeout: float = 0.2,
        backoff: float = 5.0,
        credentials: QueueCredentials | None = None,
    ) -> None:
        self.url = url
        self.shown_url = redact(url)  # every message names the server without its secrets
        self.credentials = credentials
        self.stream = stream
        self.subject = f"{stream.lower()}.jobs"
        self.results_stream = f"{stream}_RESULTS"
        self.results_prefix = f"{stream.lower()}.results"
        self.bucket = f"{stream}_STATE"
        self.durable = f"{stream.lower()}-workers"
        self.max_failures = max_failures
        self.lease_ttl = lease_ttl
        self.connect_timeout = connect_timeout
        self.fetch_timeout = fetch_timeout
        self.backoff = backoff
        self.node = ""
        self.last_error = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats", daemon=True)
        self._thread.start()
        self._nc: Any = None
        self._js: Any = None
        self._kv: Any = None
        self._psub: Any = None

    # -- plumbing -------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout if timeout is not None else self.connect_timeout + 5)
        except CoordinatorUnreachable:
            raise
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            fut.cancel()
            raise CoordinatorUnreachable(f"NATS at {self.shown_url}: {self._why(exc)}") from exc

    def _why(self, exc: BaseException) -> str:
        """What went wrong, secrets redacted. A first connection that timed out because every
        attempt was refused says "connection refused": nothing listens there, which is not a
        slow network (nats-py retries the refusals until our bound, then only times out)."""
        if isinstance(exc, TimeoutError) and "ConnectionRefused" in self.last_error:
            return "connection refused (no NATS server listens there)"
        if isinstance(exc, TimeoutError) and self.last_error:
            return f"timed out after {self.connect_timeout:g} s ({redact(self.last_error)})"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused (no NATS server listens there)"
        return redact(f"{exc.__class__.__name__} {exc}".strip())

    async def _connect(self) -> None:
        if self._nc is not None and self._nc.is_connected:
            return
        if self._nc is not None and not self._nc.is_closed:
            raise CoordinatorUnreachable(f"NATS at {self.shown_url}: disconnected, reconnecting")
        # nats-py retries a first connection as long as later reconnects (forever, here):
        # bound the first one so an unreachable coordinator is reported, not waited on.
        self.last_error = ""  # what this attempt meets, for _why()
        self._nc = await asyncio.wait_for(self._open_connection(), timeout=self.connect_timeout)
        self._js = self._nc.jetstream(timeout=self.connect_timeout)
        await self._ensure_streams()

    async def _open_connection(self) -> Any:
        cred = self.credentials
        auth: dict[str, Any] = {}
        if cred is not None and cred.creds_file:
            auth["user_credentials"] = cred.creds_file
        elif cred is not None and cred.token:
            auth["token"] = cred.token
        elif cred is not None and cred.user:
            auth["user"], auth["password"] = cred.user, cred.password
        return await nats.connect(
            self.url,
            **auth,
            connect_timeout=self.connect_timeout,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            name=f"eran-grid {self.node}".strip(),
            error_cb=self._quiet,  # the agent reports the coordinator's state in its status line
            disconnected_cb=self._noop,
            reconnected_cb=self._noop,
        )

    async def _quiet(self, exc: Exception) -> None:
        self.last_error = redact(f"{exc.__class__.__name__} {exc}".strip())

    async def _noop(self) -> None:
        pass

    async def _ensure_streams(self) -> None:
        js = self._js
        jobs = api.StreamConfig(
            name=self.stream,
            subjects=[self.subject],
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType.FILE,
            duplicate_window=120.0,
        )
        results = api.StreamConfig(
            name=self.results_stream,
            subjects=[f"{self.results_prefix}.>"],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            max_msgs_per_subject=1,
        )
        for cfg in (jobs, results):
            with contextlib.suppress(BadRequestError):  # exists (made by another node): use it as it is
                await js.add_stream(cfg)
        try:
            self._kv = await js.key_value(self.bucket)
        except (NotFoundError, BadRequestError, nats.js.errors.BucketNotFoundError):
            self._kv = await js.create_key_value(bucket=self.bucket, storage=api.StorageType.FILE)
        consumer = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.lease_ttl,
            max_deliver=-1,
            max_ack_pending=-1,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        self._psub = await js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream, config=consumer)

    async def _get_json(self, key: str) -> dict[str, Any]:
        try:
            entry = await self._kv.get(key)
        except NotFoundError:
            return {}
        return json.loads(entry.value) if entry.value else {}

    async def _put_json(self, key: str, value: dict[str, Any]) -> None:
        await self._kv.put(key, json.dumps(value).encode())

    async def _delete(self, key: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self._kv.delete(key)

    # -- administration -------------------------------------------------------------------
    def submit(
        self, command: list[str], input: bytes = b"", name: str = "", checkpoint: bool = True, priority: int = 0
    ) -> str:
        validate_command(command)
        job = Job(id=uuid.uuid4().hex[:16], command=command, input=input, name=name, checkpoint=checkpoint)

        async def go() -> None:
            await self._connect()
            await self._js.publish(self.subject, json.dumps(job.to_json()).encode(), headers={"Nats-Msg-Id": job.id})

        self._run(go())
        return job.id

    def result(self, job_id: str) -> tuple[str, bytes | None, int | None, str]:
        async def go() -> tuple[str, bytes | None, int | None, str]:
            await self._connect()
            try:
                msg = await self._js.get_last_msg(self.results_stream, f"{self.results_prefix}.{_key(job_id)}")
            except NotFoundError:
                return "queued", None, None, ""
            data = json.loads(msg.data)
            return data["status"], data["result"].encode("latin-1"), data.get("exit_code"), data.get("detail", "")

        return self._run(go())

    def counts(self) -> dict[str, int]:
        async def go() -> dict[str, int]:
            await self._connect()
            jobs = await self._js.stream_info(self.stream)
            cinfo = await self._js.consumer_info(self.stream, self.durable)
            res = await self._js.stream_info(self.results_stream)
            # JetStream counts a NAKed job as unacked until it is redelivered: "leased" here
            # means delivered and not yet acked (running, or yielded and about to come back).
            leased = cinfo.num_ack_pending
            return {"queued": jobs.state.messages - leased, "leased": leased, "done": res.state.messages, "dead": 0}

        return self._run(go())

    def jobs(self, states: tuple[str, ...] = ("queued", "leased", "done", "dead")) -> list[dict[str, Any]]:
        async def go() -> list[dict[str, Any]]:
            await self._connect()
            out: list[dict[str, Any]] = []
            if {"done", "dead"} & set(states):
                info = await self._js.stream_info(self.results_stream)
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    try:
                        msg = await self._js.get_msg(self.results_stream, seq)
                    except NotFoundError:
                        continue
                    data = json.loads(msg.data)
                    if data["status"] in states:
                        out.append(
                            {
                                "id": data["id"],
                                "name": data.get("name", ""),
                                "command": data["command"],
                                "state": data["status"],
                                "yields": data.get("yields", 0),
                                "failures": data.get("failures", 0),
                                "detail": data.get("detail", ""),
                            }
                        )
            if {"queued", "leased"} & set(states):
                info = await self._js.stream_info(self.stream)
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    try:
                        msg = await self._js.get_msg(self.stream, seq)
                    except NotFoundError:
                        continue
                    job, _why = parse_job(msg.data, f"seq-{seq}")
                    st = await self._get_json(f"job.{_key(job.id)}")
                    out.append(
                        {
                            "id": job.id,
                            "name": job.name,
                            "command": job.command,
                            "state": "queued",
                            "yields": st.get("yields", 0),
                            "failures": st.get("failures", 0),
                            "detail": "",
                        }
                    )
            return out

        return self._run(go(), timeout=60)

    def requeue(self, job_id: str) -> None:
        raise UserError(
            "dead-lettered NATS jobs are resubmitted, not requeued",
            hint="try: eran-grid results JOB, then eran-grid submit the command again",
        )

    def remove(self, job_id: str) -> None:
        raise UserError(
            "removing a queued job is not supported on the NATS backend",
            hint="purge it with the nats CLI: nats stream rmm ERANGRID SEQ",
        )

    # -- the agent's side -----------------------------------------------------------------
    def open(self, node: str) -> int:
        self.node = node

        async def go() -> int:
            await self._connect()
            held = await self._get_json(f"node.{_key(node)}")
            for reply in held.get("acks", []):
                await self._nc.publish(reply, b"-NAK")  # our previous run's leases: redeliver now
            await self._nc.flush()
            if held:
                await self._put_json(f"node.{_key(node)}", {})
            return len(held.get("acks", []))

        return self._run(go())

    def ping(self) -> None:
        async def go() -> None:
            await self._connect()
            await self._js.account_info()

        self._run(go())

    def claim(self, node: str) -> Lease | None:
        async def go() -> Lease | None:
            await self._connect()
            try:
                msgs = await self._psub.fetch(1, timeout=self.fetch_timeout)
            except (TimeoutError, nats.errors.TimeoutError, FetchTimeoutError):
                return None
            msg = msgs[0]
            job, why = parse_job(msg.data, f"seq-{msg.metadata.sequence.stream}")
            if why:  # dead-letter at once, with the reason; never crash the agent on it
                await self._publish_result(job, Outcome("dead", b"", None, f"malformed message: {why}"))
                await msg.term()
                return None
            key = _key(job.id)
            st = await self._get_json(f"job.{key}")
            delivered = msg.metadata.num_delivered
            # Deliveries that ended neither in a yield nor in a recorded failure were lost
            # (the node died): they count as failures, as in the SQLite queue.
            lost = max(0, delivered - 1 - st.get("yields", 0) - st.get("failures", 0))
            job.yields, job.failures, job.attempts = st.get("yields", 0), st.get("failures", 0) + lost, delivered
            try:
                await self._js.get_last_msg(self.results_stream, f"{self.results_prefix}.{key}")
                await msg.ack_sync()  # already finished elsewhere: a redelivered duplicate
                return None
            except NotFoundError:
                pass
            if job.failures >= self.max_failures:
                await self._publish_result(job, Outcome("dead", b"", None, f"{job.failures} failed attempts"))
                await msg.term()
                return None
            ckpt = None
            with contextlib.suppress(NotFoundError):
                ckpt = (await self._kv.get(f"ckpt.{key}")).value
            held = await self._get_json(f"node.{_key(node)}")
            await self._put_json(f"node.{_key(node)}", {"acks": [*held.get("acks", []), msg.reply]})
            return Lease(job=job, token=msg.reply, checkpoint=ckpt, handle=msg)

        return self._run(go())

    async def _forget(self, lease: Lease) -> None:
        held = await self._get_json(f"node.{_key(self.node)}")
        acks = [a for a in held.get("acks", []) if a != lease.token]
        await self._put_json(f"node.{_key(self.node)}", {"acks": acks})

    async def _publish_result(self, job: Job, outcome: Outcome) -> bool:
        body = {
            "id": job.id,
            "name": job.name,
            "command": job.command,
            "status": outcome.status,
            "result": outcome.result.decode("latin-1"),
            "exit_code": outcome.exit_code,
            "detail": outcome.detail,
            "yields": job.yields,
            "failures": job.failures,
            "node": self.node,
            "time": time.time(),
        }
        try:
            ack = await self._js.publish(
                f"{self.results_prefix}.{_key(job.id)}",
                json.dumps(body).encode(),
                stream=self.results_stream,
                headers={"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Msg-Id": job.id},
            )
        except APIError as exc:
            if exc.err_code == 10071:  # wrong last sequence: a result for this job exists already
                return False
            raise
        return not ack.duplicate  # the same Nats-Msg-Id inside the window: already stored

    def heartbeat(self, lease: Lease, checkpoint: bytes | None) -> bool:
        async def go() -> bool:
            if self._nc is None or not self._nc.is_connected:
                raise CoordinatorUnreachable(f"NATS at {self.shown_url}: disconnected")
            if checkpoint is not None:
                await self._put_checkpoint(lease, checkpoint)
            await lease.handle.in_progress()
            await self._nc.flush(timeout=self.connect_timeout)
            return True

        return self._run(go())

    async def _put_checkpoint(self, lease: Lease, checkpoint: bytes) -> None:
        if len(checkpoint) > KV_VALUE_MAX:
            raise UserError(
                f"checkpoint of job {lease.job.id} is {len(checkpoint)} bytes; the NATS backend keeps "
                f"at most {KV_VALUE_MAX}",
                hint="make the job's checkpoint smaller",
            )
        await self._kv.put(f"ckpt.{_key(lease.job.id)}", checkpoint)

    def complete(self, lease: Lease, outcome: Outcome) -> bool:
        async def go() -> bool:
            await self._connect()
            accepted = await self._publish_result(lease.job, outcome)
            await lease.handle.ack_sync()
            await self._delete(f"ckpt.{_key(lease.job.id)}")
            await self._delete(f"job.{_key(lease.job.id)}")
            await self._forget(lease)
            return accepted

        return self._run(go())

    async def _give_back(self, lease: Lease, checkpoint: bytes | None, counter: str) -> None:
        """A job handed back unfinished: its checkpoint kept, one more ``counter`` in its state."""
        await self._connect()
        if checkpoint is not None:
            await self._put_checkpoint(lease, checkpoint)
        key = f"job.{_key(lease.job.id)}"
        st = await self._get_json(key)
        st[counter] = st.get(counter, 0) + 1
        await self._put_json(key, st)

    def yield_(self, lease: Lease, checkpoint: bytes | None) -> None:
        async def go() -> None:
            await self._give_back(lease, checkpoint, "yields")
            await lease.handle.nak()
            await self._forget(lease)

        self._run(go())

    def fail(self, lease: Lease, error: str, checkpoint: bytes | None) -> str:
        async def go() -> str:
            await self._give_back(lease, checkpoint, "failures")
            await self._forget(lease)
            if lease.job.failures + 1 >= self.max_failures:
                lease.job.failures += 1
                await self._publish_result(lease.job, Outcome("dead", b"", None, error[-2000:]))
                await lease.handle.term()
                return "dead"
            await lease.handle.nak(delay=min(300.0, self.backoff * 2**lease.job.failures))
            return "queued"

        return self._run(go())

    def close(self) -> None:
        if self._loop.is_closed():
            return

        async def go() -> None:
            if self._nc is not None and not self._nc.is_closed:
                await self._nc.close()

        try:
            self._run(go(), timeout=5)
        except CoordinatorUnreachable:
            pass
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()
