"""Registry hygiene and rows read back from the store, on a real nats-server.

* Sybil: fake registrations fill the registry, a real new worker is refused (exit 3); the
  fakes never push, so their registrations expire after --expire-rounds and the real worker
  gets in (before, rows never expired and the newcomer was locked out for good).
* Tampered rows: a restarted coordinator meets a registry row with ``seen_round: "soon"``,
  one with ``shard: 99`` and one that is not JSON: each is reported and ignored, training goes
  on. A garbage ``state`` row and one with a key missing stop it with exit 5 and the reason,
  never a traceback (before: AssertionError, KeyError).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from erancloud import protocol
from erancloud.store import dump_row
from support_erancloud import ERANCLOUD, wait_for

pytestmark = pytest.mark.slow


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "erancloud", *args], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ERANCLOUD)})  # fmt: skip


def test_fake_registrations_expire_and_a_real_worker_gets_in(nats_server, procs, peek, tmp_path) -> None:
    url = nats_server.url
    status_file = tmp_path / "status.json"
    procs.start("coord", "coordinator", "--nats", url, "--rounds", "200", "--min-deltas", "1", "--round-timeout", "1",
                "--max-workers", "4", "--expire-rounds", "4", "--status-file", str(status_file))  # fmt: skip
    wait_for(status_file.exists, 180, "the coordinator")
    procs.start("a", "client", "--nats", url, "--worker-id", "a")
    p = peek()
    wait_for(lambda: p.state().get("round", 0) >= 1, 60, "round 1")
    replies = [p.request(protocol.register_subject(f"sybil{i}"), {"v": 1, "capabilities": {}}) for i in range(20)]
    assert sum(r["accepted"] for r in replies) == 3  # the registry holds 4 live workers: a + 3
    assert "registry is full" in replies[-1]["reason"]
    refused = p.request(protocol.register_subject("late"), {"v": 1, "capabilities": {}})
    assert not refused["accepted"] and "registry is full" in refused["reason"]
    r0 = p.state()["round"]
    wait_for(lambda: p.state()["round"] >= r0 + 5, 60, "five rounds without the fakes")
    # the expiry is logged (and its row deleted) just after the state of the new round is saved
    wait_for(lambda: "registration of sybil0 expired" in procs.log("coord"), 120, "sybil0's registration to expire")
    wait_for(lambda: p.get("worker.sybil0") is None, 120, "sybil0's row to be deleted")
    assert p.get("worker.sybil0") is None and p.get("worker.a") is not None
    late = _run("client", "--nats", url, "--worker-id", "late", "--rounds", "1")
    assert late.returncode == 0, late.stderr


def test_tampered_rows_are_reported_and_ignored_or_stop_with_a_reason(nats_server, procs, peek, tmp_path) -> None:
    url = nats_server.url
    args = ["coordinator", "--nats", url, "--rounds", "50", "--min-deltas", "1", "--round-timeout", "1",
            "--status-file", str(tmp_path / "status.json")]  # fmt: skip
    procs.start("coord", *args)
    wait_for((tmp_path / "status.json").exists, 180, "the coordinator")
    procs.procs["coord"].kill()
    procs.wait("coord")
    p = peek()
    good = {"v": 1, "worker": "evil", "shard": 0, "registered_round": 0, "seen_round": 0, "capabilities": {}}
    p.run(p.store.kv.put("worker.evil", dump_row({**good, "seen_round": "soon"})))
    p.run(p.store.kv.put("worker.far", dump_row({**good, "worker": "far", "shard": 99})))
    p.run(p.store.kv.put("worker.junk", b"\xff garbage"))
    procs.start("coord", *args)
    # --register-timeout: the restarted coordinator may take a while to answer on a busy machine.
    solo = _run("client", "--nats", url, "--worker-id", "solo", "--rounds", "1", "--register-timeout", "90")
    assert solo.returncode == 0, solo.stderr + procs.log("coord")[-2000:]
    log = procs.log("coord")
    for key, why in (
        ("worker.evil", "seen_round 'soon'"),
        ("worker.far", "shard '99'"),
        ("worker.junk", "not a small JSON"),
    ):
        assert f"ignored registry row '{key}': " in log and why in log, log[-2000:]
    procs.procs["coord"].kill()
    procs.wait("coord")

    state = p.state()
    for broken, why in ((b"\x00garbage", "not a small JSON object"),
                        (dump_row({k: v for k, v in state.items() if k != "shards"}), "shards"),
                        (dump_row({**state, "round": "soon"}), "round")):  # fmt: skip
        p.run(p.store.kv.put("state", broken))
        res = _run("coordinator", *args[1:])
        assert res.returncode == 5, res.stderr
        assert "round state in the store is unusable" in res.stderr and why in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    p.run(p.store.kv.put("state", dump_row(state)))
    fig = json.loads(_run("status", "--nats", url, "--json").stdout)
    assert fig["round"] == state["round"]
