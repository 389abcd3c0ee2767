"""The coordinator acts for a worker only with that worker's rights; a push is judged once.

Tried by a tester holding one issued worker credential (mallory), against the real
coordinator process and nats-server run with the config ``init-auth`` writes:

* a registration whose reply subject is ``$KV.ERANCLOUD.state`` (or another worker's row,
  or its push keys): answered with the coordinator's rights, it once overwrote the round
  state (the coordinator exited, every restart exited 5) and squatted honest push keys.
  Now it is not answered at all, and the connection that answers may not write there anyway;
* ``Nats-Rollup: all`` on its own push subject once purged every worker's push record;
* its accepted push rewritten across a coordinator restart once replaced the applied delta
  and the verdict; another worker's accepted delta re-sent as its own was accepted;
* a registration that never pushes once held every round to its deadline, and a flood of
  registrations was served without limit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
from erancloud import protocol, wire
from erancloud.model import MLP
from erancloud.store import PUSH_BUCKET, Creds
from nats.js import api
from support_erancloud import ERANCLOUD, AuthClient, ask, push_delta, wait_for

pytestmark = pytest.mark.slow

REGISTRATION = json.dumps({"v": 1, "capabilities": {"cpus": 1}}).encode()


def _creds(auth, user: str) -> Creds:
    return Creds.load(auth.creds_path(user))


def _status(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _start_coordinator(procs, url: str, tmp_path, *args: str, creds=None):
    status = tmp_path / "status.json"
    status.unlink(missing_ok=True)
    extra = ["--creds", str(creds)] if creds else []
    procs.start("coord", "coordinator", "--nats", url, "--rounds", "100", "--status-file", str(status), *extra, *args)
    wait_for(status.exists, 180, "the coordinator's first status")
    return status


def _register(client: AuthClient, worker: str) -> dict:
    msg = client.run(ask(client.store.nc, protocol.register_subject(worker), REGISTRATION, 60))
    reply = json.loads(msg.data)
    assert reply["accepted"], reply
    return reply


def _verdict(client: AuthClient, round_no: int, worker: str, timeout: float = 60) -> dict:
    return wait_for(
        lambda: client.run(client.store.get_json(protocol.verdict_key(round_no, worker)))[0],
        timeout,
        f"the verdict on {worker}'s push of round {round_no}",
    )


def test_a_reply_subject_never_makes_the_coordinator_write_for_the_requester(auth_server, procs, tmp_path) -> None:
    server, auth = auth_server
    status = _start_coordinator(procs, server.url, tmp_path, "--min-deltas", "2", "--round-timeout", "600",
                                creds=auth.creds_path("coordinator"))  # fmt: skip
    w1 = AuthClient(server.url, _creds(auth, "w1"))
    mallory = AuthClient(server.url, _creds(auth, "mallory"))
    _register(w1, "w1")
    state_before, _ = w1.run(w1.store.get_json("state"))
    row_before, _ = w1.run(w1.store.get_json("worker.w1"))
    targets = [
        "$KV.ERANCLOUD.state",
        "$KV.ERANCLOUD.worker.w1",
        *(f"$KV.{PUSH_BUCKET}.{protocol.push_key(r, 'w1')}" for r in range(6)),
        "_INBOX.w1.stolen",  # another worker's inbox
        "_INBOX.coordinator.x",
        "_INBOX.mallory",  # no token: not an inbox nats-py makes
    ]
    for reply in targets:
        mallory.run(mallory.store.nc.publish(protocol.register_subject("mallory"), REGISTRATION, reply=reply))
    mallory.run(mallory.store.nc.flush())
    wait_for(lambda: _status(status).get("rejected", {}).get("bad reply subject", 0) >= len(targets), 60,
             "every forged reply subject refused")  # fmt: skip
    # The coordinator still answers a registration on the requester's own inbox.
    assert _register(mallory, "mallory")["shard"].startswith("shard.")
    assert procs.procs["coord"].poll() is None, procs.log("coord")[-2000:]
    state_after, _ = w1.run(w1.store.get_json("state"))
    assert protocol.check_coordinator_state(state_after) is None
    assert state_after["model_sha256"] == state_before["model_sha256"]
    assert w1.run(w1.store.get_json("worker.w1"))[0] == row_before
    for r in range(6):
        assert w1.run(w1.store.get_json(protocol.push_key(r, "w1"))) == (None, 0)
    # w1's own push key is still free for w1.
    assert w1.run(w1.store.create_json(protocol.push_key(0, "w1"), {"v": 1}))
    for c in (w1, mallory):
        c.close()


def test_the_reply_connection_may_write_no_bucket_and_the_coordinator_no_reply(auth_server) -> None:
    """Server-side, whatever the coordinator's code checks: the connection that answers workers
    publishes to inboxes only; the coordinator's main connection answers nobody."""
    server, auth = auth_server
    coord = AuthClient(server.url, _creds(auth, "coordinator"), create=True)
    replies = AuthClient(server.url, _creds(auth, "coordinator-replies"), buckets=False)
    coord.run(coord.store.put_json("state", {"v": 1, "round": 3}))
    js = replies.store.nc.jetstream(timeout=3)
    assert replies.refused(js.publish("$KV.ERANCLOUD.state", b'{"v": 1, "round": 99}'))
    assert replies.refused(js.publish(f"$KV.{PUSH_BUCKET}.push.4.w1", b"{}"))
    replies.run(replies.store.nc.publish("$KV.ERANCLOUD.worker.w1", b"{}"))
    replies.run(replies.store.nc.flush())
    coord.run(coord.store.nc.publish("_INBOX.w1.abc", b"{}"))
    coord.run(coord.store.nc.flush())
    assert coord.run(coord.store.get_json("state"))[0] == {"v": 1, "round": 3}
    assert coord.run(coord.store.get_json("worker.w1")) == (None, 0)

    def violations() -> bool:
        log = server.log.read_text()
        return all(
            f'Publish Violation - User "{user}", Subject "{subject}"' in log
            for user, subject in (
                ("coordinator-replies", "$KV.ERANCLOUD.state"),
                ("coordinator-replies", "$KV.ERANCLOUD.worker.w1"),
                ("coordinator", "_INBOX.w1.abc"),
            )
        )

    wait_for(violations, 120, "the server's permission violations in its log")
    replies.close()
    coord.close()


def test_a_rollup_header_purges_no_push_not_even_on_a_bucket_made_by_an_older_coordinator(
    auth_server, procs, tmp_path
) -> None:
    server, auth = auth_server
    coord = AuthClient(server.url, _creds(auth, "coordinator"), buckets=False)
    # The push bucket as an older coordinator made it: nats-py's default allows rollups.
    coord.run(coord.store.js.create_key_value(bucket=PUSH_BUCKET, history=1, max_value_size=4096))
    assert coord.run(coord.store.js.stream_info(f"KV_{PUSH_BUCKET}")).config.allow_rollup_hdrs
    _start_coordinator(procs, server.url, tmp_path, "--min-deltas", "2", "--round-timeout", "600",
                       creds=auth.creds_path("coordinator"))  # fmt: skip
    info = coord.run(coord.store.js.stream_info(f"KV_{PUSH_BUCKET}"))
    assert not info.config.allow_rollup_hdrs and info.config.discard == api.DiscardPolicy.OLD
    w1 = AuthClient(server.url, _creds(auth, "w1"))
    mallory = AuthClient(server.url, _creds(auth, "mallory"))
    assert w1.run(w1.store.create_json(protocol.push_key(0, "w1"), {"v": 1, "honest": True}))
    for rollup in ("all", "sub"):
        assert mallory.refused(
            mallory.store.js.publish(f"$KV.{PUSH_BUCKET}.push.0.mallory", b"{}", headers={"Nats-Rollup": rollup})
        )
    assert w1.run(w1.store.get_json(protocol.push_key(0, "w1")))[0] == {"v": 1, "honest": True}
    for c in (w1, mallory, coord):
        c.close()


def test_a_judged_push_stands_across_a_restart_and_values_are_accepted_once(auth_server, procs, tmp_path) -> None:
    server, auth = auth_server
    args = ("--min-deltas", "2", "--round-timeout", "600")
    creds = auth.creds_path("coordinator")
    _start_coordinator(procs, server.url, tmp_path, *args, creds=creds)
    w1 = AuthClient(server.url, _creds(auth, "w1"))
    mallory = AuthClient(server.url, _creds(auth, "mallory"))
    _register(w1, "w1")
    _register(mallory, "mallory")
    state, _ = w1.run(w1.store.get_json("state"))
    count = MLP(hidden=int(state["train"]["hidden"])).count
    rng = np.random.default_rng(7)
    first = push_delta(mallory, "mallory", 0, rng.normal(0, 0.01, count).astype(np.float32))
    verdict = _verdict(w1, 0, "mallory")
    assert verdict["accepted"] and verdict["sha256"] == first

    # The coordinator dies; mallory rewrites its judged push, after reading what it liked.
    procs.procs["coord"].send_signal(signal.SIGKILL)
    procs.wait("coord")
    push_delta(mallory, "mallory", 0, rng.normal(0, 0.5, count).astype(np.float32), rewrite=True)
    _start_coordinator(procs, server.url, tmp_path, *args, creds=creds)
    honest = push_delta(w1, "w1", 0, rng.normal(0, 0.01, count).astype(np.float32))
    record = wait_for(lambda: w1.run(w1.store.get_json(protocol.round_key(0)))[0], 120, "round 0 closed")
    applied = {a["worker"]: a["sha256"] for a in record["applied"]}
    assert applied == {"mallory": first, "w1": honest}
    assert _verdict(w1, 0, "mallory") == verdict  # written once, never re-derived

    # Round 1: w1's accepted delta of round 0, re-sent by mallory as its own.
    blob = w1.run(w1.store.get_blob(protocol.delta_object(0, "w1", honest)))
    stolen, _ = wire.decode_vector(blob, "delta", count)
    push_delta(mallory, "mallory", 1, stolen)
    again = _verdict(w1, 1, "mallory")
    assert not again["accepted"] and "duplicate delta" in again["reason"] and "w1" in again["reason"]
    for c in (w1, mallory):
        c.close()


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "erancloud", *args], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ERANCLOUD)})  # fmt: skip


def test_a_silent_registration_holds_no_round_and_floods_are_rate_limited(nats_server, procs, peek, tmp_path) -> None:
    url = nats_server.url
    # Ten minutes a round: only the grace after the quorum lets rounds close while one
    # registered worker stays silent.
    status = _start_coordinator(procs, url, tmp_path, "--min-deltas", "1", "--round-timeout", "600")
    p = peek()
    assert p.request(protocol.register_subject("silent"), {"v": 1, "capabilities": {}}, timeout=60)["accepted"]
    worker = _run("client", "--nats", url, "--worker-id", "a", "--rounds", "3", "--register-timeout", "90",
                  timeout=400)  # fmt: skip
    assert worker.returncode == 0, worker.stderr[-2000:]
    wait_for(lambda: "silent" in _status(status).get("silent_workers", []), 60, "the silent worker shown in status")

    # A flood of registrations on one's own subject: a burst is served, the rest dropped and counted.
    inbox = "_INBOX.flood.x"
    for i in range(60):
        p.run(p.store.nc.publish(protocol.register_subject("flood"), REGISTRATION, reply=f"{inbox}.{i}"))
    p.run(p.store.nc.flush())
    wait_for(lambda: _status(status).get("rejected", {}).get("rate limited", 0) >= 30, 60, "the flood counted")


def test_a_password_in_the_url_is_never_printed(tmp_path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = _run("status", "--nats", f"nats://agent:S3CRET-pass@127.0.0.1:{port}", timeout=120)
    assert res.returncode == 4, res.stderr
    assert "S3CRET" not in res.stdout + res.stderr
    assert f"nats://***@127.0.0.1:{port}" in res.stderr and "refused" in res.stderr
