"""Helpers for ERANCLOUD's tests: the program run as separate processes from the checkout
(``python -m erancloud``), a JetStream client the test uses to look at (and attack) the
store directly, and a polling wait."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from support import wait_for  # noqa: F401 (one wait for every test; imported from here by erancloud tests)

ERANCLOUD = Path(__file__).resolve().parent.parent / "tools" / "erancloud"
if str(ERANCLOUD) not in sys.path:
    sys.path.insert(0, str(ERANCLOUD))


class Procs:
    """Every eran-cloud process a test starts; all of them are ended with the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, name: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Any:
        workdir = cwd or (self.tmp / name)
        workdir.mkdir(parents=True, exist_ok=True)
        full_env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "PYTHONPATH": str(ERANCLOUD), **(env or {})}
        log = self.tmp / f"{name}.{len([k for k in self.logs if k.startswith(name)])}.log"
        self.logs[name] = log
        out = self.tmp / f"{name}.stdout"
        proc = subprocess.Popen(
            [sys.executable, "-m", "erancloud", *args],
            stdout=open(out, "wb"),  # noqa: SIM115 - the child owns it
            stderr=open(log, "wb"),  # noqa: SIM115
            cwd=workdir,
            env=full_env,
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def stdout(self, name: str) -> str:
        return (self.tmp / f"{name}.stdout").read_text(errors="replace")

    def wait(self, name: str, timeout: float = 60) -> int:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout} s; log:\n{self.log(name)[-3000:]}") from None

    def wait_beside(self, name: str, others: tuple[str, ...], timeout: float) -> int:
        """Wait for ``name`` to exit; fail at once, with its log, when one of ``others`` (the
        processes it needs) exits with an error first, rather than waiting out ``timeout``."""
        deadline = time.monotonic() + timeout
        while (code := self.procs[name].poll()) is None:
            for other in others:
                rc = self.procs[other].poll()
                assert rc in (None, 0), f"{other} exited {rc} while {name} ran; log:\n{self.log(other)[-2000:]}"
            if time.monotonic() >= deadline:
                raise AssertionError(f"{name} still running after {timeout} s; log:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)
        return code

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


class Peek:
    """The test's own JetStream connection (nats-py on a private event loop)."""

    def __init__(self, url: str) -> None:
        from erancloud.store import Store

        self.loop = asyncio.new_event_loop()
        self.store = Store(url)
        self.run(self.store.connect(create=True))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.run(self.store.get_json(key))[0]

    def state(self) -> dict[str, Any]:
        row = self.get("state")
        return row or {}

    def blob(self, name: str) -> bytes | None:
        return self.run(self.store.get_blob(name))

    def request(self, subject: str, payload: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """A registration as the worker the subject names would send it: the reply on an
        inbox of that worker (the only reply subject the coordinator answers on)."""
        return json.loads(self.run(ask(self.store.nc, subject, json.dumps(payload).encode(), timeout)).data)

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()


async def ask(nc: Any, subject: str, data: bytes, timeout: float, reply: str | None = None) -> Any:
    """A request whose reply subject the test chooses (default: an inbox of the worker the
    subject names); raises TimeoutError when nothing answers within ``timeout``."""
    inbox = f"_INBOX.{subject.rpartition('.')[2]}.{secrets.token_hex(8)}"
    sub = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, data, reply=reply or inbox)
        return await sub.next_msg(timeout=timeout)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


class AuthClient:
    """One authenticated connection, its event loop running in a thread of its own (so two
    clients of one test answer each other)."""

    def __init__(self, url: str, creds: Any, create: bool = False, buckets: bool = True) -> None:
        from erancloud.store import Store

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        # 15 s per call: a loaded machine once took more than 1 s to connect. A refused write
        # (no ack ever comes) is judged by ``refused``'s own 3 s bound.
        self.store = Store(url, timeout=15.0, creds=creds)
        try:
            self.run(self.store.connect(create=create) if buckets else self.store.connect(buckets=False))
        except BaseException:
            self._stop()
            raise

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def refused(self, coro: Any) -> bool:
        """True when the write failed: the server dropped it (a permissions violation: no
        JetStream ack comes, nats-py times out) or answered with an error."""
        try:
            self.run(asyncio.wait_for(coro, 3.0))
        except Exception:  # any failure is a refusal; only success is not
            return True
        return False

    def close(self) -> None:
        self.run(self.store.close())
        self._stop()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def push_delta(client: AuthClient, worker: str, round_no: int, delta: Any, *, rewrite: bool = False) -> str:
    """What a worker's client does for a push: the delta into its own bucket, then the push row."""
    from erancloud import protocol, wire

    state, _ = client.run(client.store.get_json("state"))
    base = state["model_sha256"]
    blob = wire.encode_vector("delta", delta, worker=worker, round=round_no, base_sha256=base)
    sha = wire.sha256(blob)
    name = protocol.delta_object(round_no, worker, sha)
    client.run(client.store.put_blob(name, blob, bucket=protocol.inbox_bucket(worker)))
    record = protocol.push_record(worker, round_no, base, name, sha, 100, 20)
    key = protocol.push_key(round_no, worker)
    if rewrite:
        client.run(client.store.put_json(key, record))  # a plain put: allowed on its own key
    else:
        assert client.run(client.store.create_json(key, record))
    return sha
