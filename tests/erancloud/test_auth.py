"""Authenticated roles enforced by nats-server itself (the config ``eran-cloud coordinator
init-auth`` writes, run by a real nats-server): a worker holding valid credentials tries to
squat another worker's push keys, to register under another's id, to write ``state``,
``worker.*`` and ``verdict.*`` rows, models and another worker's delta bucket: the server
refuses every one (its log names the permissions violation), while the same worker's own
push key and own bucket work. No credential, a wrong password and the ERAN-GRID agent's
credential reach nothing of ERANCLOUD. ``issue-worker`` on a running server: the new
worker can connect once the server reloaded, a revoked one no longer can."""

from __future__ import annotations

import asyncio
import base64
import json
import stat
import subprocess
import sys

import pytest
from erancloud import protocol
from erancloud.auth import AuthDir
from erancloud.client import Options, Worker
from erancloud.errors import BadBlob, CoordinatorUnreachable
from erancloud.store import KV_BUCKET, OBJ_BUCKET, PUSH_BUCKET, PUSH_MAX_BYTES, Creds
from nats.js import api
from support_erancloud import ERANCLOUD, AuthClient, wait_for

pytestmark = pytest.mark.slow


Client = AuthClient


def _creds(auth: AuthDir, user: str) -> Creds:
    return Creds.load(auth.creds_path(user))


def test_the_server_refuses_what_a_worker_may_not_write(auth_server) -> None:
    server, auth = auth_server
    coord = Client(server.url, _creds(auth, "coordinator"), create=True)
    coord.run(coord.store.put_json("state", {"v": 1, "round": 3}))
    for w in ("w1", "mallory"):
        coord.run(coord.store.inbox(w, create=True))
    got: list[str] = []

    async def on_register(msg) -> None:
        got.append(msg.subject)
        await msg.respond(b"{}")

    replies = Client(server.url, _creds(auth, "coordinator-replies"), buckets=False)
    replies.run(replies.store.nc.subscribe(f"{protocol.REGISTER_PREFIX}.*", cb=on_register))
    replies.run(replies.store.nc.flush())
    mallory = Client(server.url, _creds(auth, "mallory"))
    m = mallory.store

    # What mallory may do: read the state, register as itself, create its own push key, write
    # its own delta bucket.
    assert mallory.run(m.get_json("state"))[0] == {"v": 1, "round": 3}
    reply = mallory.run(m.nc.request(protocol.register_subject("mallory"), b"{}", timeout=3))
    assert reply.data == b"{}" and got == ["erancloud.v1.register.mallory"]
    assert mallory.run(m.create_json(protocol.push_key(4, "mallory"), {"v": 1}))
    mallory.run(m.put_blob("delta.4.mallory.000000000000", b"x" * 100, bucket=protocol.inbox_bucket("mallory")))

    # What it may not: every one refused by the server, nothing written.
    attacks = {
        "squat w1's push keys": [m.create_json(protocol.push_key(r, "w1"), {"v": 1}) for r in range(4, 9)],
        "write the round state": [m.put_json("state", {"v": 1, "round": 99})],
        "write a registry row": [m.put_json("worker.evil", {"v": 1, "worker": "evil", "seen_round": "soon"})],
        "write a verdict": [m.put_json(protocol.verdict_key(3, "mallory"), {"accepted": True})],
        "write a model": [m.put_blob("model.4", b"x" * 100)],
        "write into w1's bucket": [m.put_blob("delta.4.w1.0", b"x", bucket=protocol.inbox_bucket("w1"))],
        "purge the KV stream": [m.js.purge_stream(f"KV_{KV_BUCKET}")],
        "purge the push stream": [m.js.purge_stream(f"KV_{PUSH_BUCKET}")],
        "make its push bucket unbounded": [
            m.js.update_stream(
                config=api.StreamConfig(name=f"KV_{PUSH_BUCKET}", subjects=[f"$KV.{PUSH_BUCKET}.>"], max_bytes=-1)
            )
        ],
        "create a stream": [m.js.add_stream(name="EVIL", subjects=["evil.>"])],
        "delete a KV message": [m.js.delete_msg(f"KV_{KV_BUCKET}", 1)],
        "purge w1's bucket": [m.js.purge_stream(f"OBJ_{protocol.inbox_bucket('w1')}")],
        "delete the object stream": [m.js.delete_stream(f"OBJ_{OBJ_BUCKET}")],
    }
    for what, calls in attacks.items():
        for call in calls:
            assert mallory.refused(call), what
    # Forging w1's id on the registration subject: the server drops it before the coordinator.
    mallory.run(m.nc.publish(protocol.register_subject("w1"), b"{}"))
    # A request of its own behind it on the same connection: once answered, the forged message
    # (sent first, same path, same subscriber) would have been delivered: no sleep to guess.
    mallory.run(m.nc.request(protocol.register_subject("mallory"), b"{}", timeout=60))
    assert got == ["erancloud.v1.register.mallory"] * 2

    def seen(key):
        return coord.run(coord.store.get_json(key))

    assert all(seen(protocol.push_key(r, "w1")) == (None, 0) for r in range(4, 9))
    assert seen("state")[0] == {"v": 1, "round": 3}
    assert seen("worker.evil") == (None, 0) and seen(protocol.verdict_key(3, "mallory")) == (None, 0)
    assert coord.run(coord.store.get_blob("model.4")) is None
    assert coord.run(coord.store.get_blob("delta.4.w1.0", bucket=protocol.inbox_bucket("w1"))) is None
    assert seen(protocol.push_key(4, "mallory"))[0] == {"v": 1}
    log = server.log.read_text()
    for subject in ("$KV.ERANCLOUD_PUSH.push.4.w1", "$KV.ERANCLOUD.state", "$KV.ERANCLOUD.worker.evil",
                    "erancloud.v1.register.w1", "$JS.API.STREAM.DELETE.OBJ_ERANCLOUD_OBJ"):  # fmt: skip
        assert f'Publish Violation - User "mallory", Subject "{subject}"' in log

    # A 5 MiB junk object in its own bucket: over the bucket's limit, refused by the server.
    assert mallory.refused(m.put_blob("junk", b"\0" * (5 * 1024 * 1024), bucket=protocol.inbox_bucket("mallory")))
    info = coord.run(coord.store.js.stream_info(f"OBJ_{OBJ_BUCKET}"))
    assert 0 < info.config.max_bytes <= 128 * 1024 * 1024  # a 256 MiB object cannot fit
    mallory.close()
    replies.close()

    # No credential, a wrong password: the server refuses the connection; the cause is named.
    for creds in (None, Creds("w1", "not-the-password")):
        with pytest.raises(CoordinatorUnreachable, match="uthorization"):
            Client(server.url, creds)
    # The ERAN-GRID agent lives in an account of its own: ERANCLOUD's buckets do not exist there.
    with pytest.raises(CoordinatorUnreachable, match="no ERANCLOUD buckets"):
        Client(server.url, _creds(auth, "erangrid-agent"))
    coord.close()


def test_a_flood_of_push_rows_locks_out_neither_the_coordinator_nor_an_honest_worker(auth_server) -> None:
    """A worker may create push rows under its own name for any round: created as fast as the
    server takes them, they once filled the bucket the round state lives in (1,117 rows of 60 KB
    in 11 s, then the coordinator's every write failed with 'maximum bytes exceeded' and
    training stopped). Push rows now live in a bucket of their own, small values only, which
    drops its oldest rows when full."""
    server, auth = auth_server
    coord = Client(server.url, _creds(auth, "coordinator"), create=True)
    mallory = Client(server.url, _creds(auth, "mallory"))
    m = mallory.store

    async def flood(size: int, count: int) -> None:
        for r in range(count):
            await m.nc.publish(f"$KV.{PUSH_BUCKET}.{protocol.push_key(10 + r, 'mallory')}", b"x" * size)
        await m.nc.flush(timeout=30)

    mallory.run(flood(60_000, 300))  # over the push bucket's value limit: none stored
    mallory.run(flood(3_900, 6_000))  # 23 MB of small rows: more than the bucket holds
    info = coord.run(coord.store.js.stream_info(f"KV_{PUSH_BUCKET}"))
    wait_for(lambda: coord.run(coord.store.js.stream_info(f"KV_{PUSH_BUCKET}")).state.last_seq >= 6_000, 120,
             "the flood stored")  # fmt: skip
    info = coord.run(coord.store.js.stream_info(f"KV_{PUSH_BUCKET}"))
    assert info.state.bytes <= PUSH_MAX_BYTES and info.state.messages < 6_000  # the oldest rows went
    # The coordinator's rows are elsewhere, untouched by the flood.
    coord.run(coord.store.put_json("state", {"v": 1, "round": 3}))
    coord.run(coord.store.put_json(protocol.verdict_key(3, "w1"), {"v": 1}))
    assert coord.run(coord.store.js.stream_info(f"KV_{KV_BUCKET}")).state.bytes < 64 * 1024
    # An honest worker still pushes.
    w1 = Client(server.url, _creds(auth, "w1"))
    assert w1.run(w1.store.create_json(protocol.push_key(3, "w1"), {"v": 1, "round": 3}))
    assert coord.run(coord.store.get_json(protocol.push_key(3, "w1")))[0] == {"v": 1, "round": 3}
    for c in (w1, mallory, coord):
        c.close()


def test_a_worker_creates_no_consumers_and_its_links_are_not_followed(auth_server) -> None:
    """Reading objects needs no consumer (direct gets, chunk by chunk): the server refuses a
    worker every consumer, durable or ephemeral, old or new API (it once made 300 durable
    consumers on ERANCLOUD_OBJ in 5 s, kept for ever). A link object in a worker's own bucket,
    pointing into ERANCLOUD_OBJ, is refused, not followed."""
    server, auth = auth_server
    coord = Client(server.url, _creds(auth, "coordinator"), create=True)
    coord.run(coord.store.inbox("mallory", create=True))
    coord.run(coord.store.put_blob("model.1", b"m" * 300_000))  # three chunks
    mallory = Client(server.url, _creds(auth, "mallory"))
    m = mallory.store
    assert mallory.run(m.get_blob("model.1")) == b"m" * 300_000  # what a worker reads: still read
    mallory.run(m.put_blob("delta.1.mallory.0", b"d" * 10, bucket=protocol.inbox_bucket("mallory")))
    assert mallory.run(m.get_blob("delta.1.mallory.0", bucket=protocol.inbox_bucket("mallory"))) == b"d" * 10
    stream = f"OBJ_{OBJ_BUCKET}"

    def raw(subject: str, config: dict) -> bool:
        body = json.dumps({"stream_name": stream, "config": config}).encode()
        return mallory.refused(m.nc.request(subject, body, timeout=2))

    assert raw(f"$JS.API.CONSUMER.CREATE.{stream}.evil", {"durable_name": "evil", "name": "evil"})
    assert raw(f"$JS.API.CONSUMER.CREATE.{stream}", {"inactive_threshold": 10**15})
    assert raw(f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.evil", {"durable_name": "evil"})
    assert mallory.refused(m.js.add_consumer(stream, api.ConsumerConfig(durable_name="evil2")))
    assert coord.run(coord.store.js.stream_info(stream)).state.consumer_count == 0
    # A link named like a delta, into the coordinator's bucket: refused as a bad blob.
    bucket, name = protocol.inbox_bucket("mallory"), "delta.2.mallory.0"
    meta = {"name": name, "bucket": bucket, "nuid": "x", "size": 0, "chunks": 0, "digest": "",
            "options": {"link": {"bucket": OBJ_BUCKET, "name": "model.1"}}}  # fmt: skip
    subject = f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
    mallory.run(m.js.publish(subject, json.dumps(meta).encode(), headers={"Nats-Rollup": "sub"}))
    with pytest.raises(BadBlob, match="link"):
        coord.run(coord.store.get_blob("delta.2.mallory.0", bucket=protocol.inbox_bucket("mallory")))
    mallory.close()
    coord.close()


def test_issue_worker_reloads_the_server_and_revoke_locks_out(auth_server, tmp_path) -> None:
    server, auth = auth_server
    coord = Client(server.url, _creds(auth, "coordinator"), create=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ERANCLOUD)}

    def issue(name: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "erancloud", "coordinator", "issue-worker", name, "--auth-dir", str(auth.path)]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    res = issue("late")
    assert res.returncode == 0, res.stderr
    path = auth.creds_path("late")
    assert json.loads(res.stdout)["creds"] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(auth.conf.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["password"] not in auth.conf.read_text()  # only its bcrypt hash

    def connects(user: str) -> bool:
        try:
            Client(server.url, Creds.load(path) if user == "late" else _creds(auth, user)).close()
            return True
        except (CoordinatorUnreachable, TimeoutError):  # refused, or caught by the reload: again
            return False

    wait_for(lambda: connects("late"), 120, "the server to reload and accept the new worker")
    again = issue("late")
    assert again.returncode == 2 and "has a credential already" in again.stderr
    bad = issue("coordinator")
    assert bad.returncode == 2
    creds = _creds(auth, "w1")
    auth.revoke("w1", reload=True)
    wait_for(lambda: not connects_with(server.url, creds), 120, "the revoked worker locked out")
    coord.close()


def connects_with(url: str, creds: Creds) -> bool:
    """True when ``creds`` connect, False when the server refuses them. A connect the reload
    cut off mid-way (the server drops the connection and nats-py reconnects until the call's
    time is up) decides nothing: it counts as "still connects", and the caller asks again."""
    try:
        Client(url, creds).close()
        return True
    except CoordinatorUnreachable:
        return False
    except TimeoutError:
        return True


def test_a_refused_credential_is_not_ridden_out_as_an_outage(auth_server) -> None:
    """The worker waits for a server slower than one connect (an outage); a wrong password is
    a refusal, and waiting changes nothing: it fails at once, the cause named, no retry."""
    server, _auth = auth_server
    lines: list[str] = []
    opts = Options(worker="w1", timeout=10.0, outage_window=60.0, creds=Creds("w1", "not-the-password"))
    worker = Worker(server.url, opts, lines.append)
    with pytest.raises(CoordinatorUnreachable, match="uthorization"):
        asyncio.run(worker.connect())
    assert not [line for line in lines if "retrying" in line], lines
