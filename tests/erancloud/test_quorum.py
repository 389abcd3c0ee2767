"""Rounds close on a quorum: at least ``--min-deltas`` and a share (``--quorum-share``, 0.5)
of the eligible workers (registered or active within the live window, not suspect, not past
the open round's deadline). Before, a round closed on ``--min-deltas`` alone: the first
workers in line closed the first rounds among themselves, whoever registered after them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from erancloud import protocol
from erancloud.coordinator import Config, Coordinator
from erancloud.model import MLP
from support_erancloud import AuthClient, ask, push_delta, wait_for

REGISTRATION = json.dumps({"v": 1, "capabilities": {"cpus": 1}}).encode()


def _coordinator(min_deltas: int = 3, share: float = 0.5) -> Coordinator:
    c = Coordinator(Config(min_deltas=min_deltas, quorum_share=share), store=None, log=lambda _: None)  # type: ignore[arg-type]
    c.state = {"round": 10, "live_window": 3, "min_deltas": min_deltas, "quorum_share": share, "last_push": {},
               "outliers": {}, "suspect_after": 3}  # fmt: skip
    return c


def test_the_quorum_is_the_larger_of_min_deltas_and_the_share_of_eligible_workers() -> None:
    c = _coordinator()
    c.registry = {f"w{i}": {"seen_round": 10} for i in range(9)}
    assert c.quorum() == 5  # ceil(0.5 * 9)
    c.registry["old"] = {"seen_round": 2}  # registered long ago, never a delta since: not eligible
    assert c.quorum() == 5
    c.state["last_push"] = {"old": 9, "gone": 1}  # a delta applied within the window: eligible again
    assert c.quorum() == 5  # ceil(0.5 * 10)
    c.state["last_push"]["x"] = 10
    assert c.quorum() == 6
    c.state["outliers"] = {w: {"verdict": "down-weighted", "streak": 3} for w in ("w0", "w1", "w2", "x")}
    assert c.quorum() == 4  # suspects are not counted: ceil(0.5 * 7)
    c.missed = {"w3", "w4", "w5", "w6"}  # let this round's deadline pass
    assert c.quorum() == 3  # never below --min-deltas
    assert _coordinator(min_deltas=1, share=0.0).quorum() == 1


def _status(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _setup(nats_server, procs, tmp_path, timeout: str) -> tuple[AuthClient, object, int]:
    status = tmp_path / "status.json"
    procs.start("coord", "coordinator", "--nats", nats_server.url, "--rounds", "50", "--min-deltas", "1",
                "--round-timeout", timeout, "--status-file", str(status))  # fmt: skip
    wait_for(status.exists, 180, "the coordinator's first status")
    c = AuthClient(nats_server.url, None)
    for w in ("w1", "w2", "w3", "w4"):
        assert json.loads(c.run(ask(c.store.nc, protocol.register_subject(w), REGISTRATION, 60)).data)["accepted"]
    state, _ = c.run(c.store.get_json("state"))
    return c, status, MLP(hidden=int(state["train"]["hidden"])).count


@pytest.mark.slow
def test_the_first_round_waits_for_a_share_of_the_registered_workers(nats_server, procs, tmp_path) -> None:
    c, status, count = _setup(nats_server, procs, tmp_path, "600")
    rng = np.random.default_rng(3)
    try:
        push_delta(c, "w1", 0, rng.normal(0, 0.01, count).astype(np.float32))
        wait_for(lambda: c.run(c.store.get_json(protocol.verdict_key(0, "w1")))[0], 120, "w1's verdict")
        # Four registered, --min-deltas 1: the round needs two deltas and says so.
        wait_for(lambda: _status(status).get("quorum") == 2, 60, "quorum 2 in status")
        assert _status(status)["round"] == 0
        push_delta(c, "w2", 0, rng.normal(0, 0.01, count).astype(np.float32))
        record = wait_for(lambda: c.run(c.store.get_json(protocol.round_key(0)))[0], 120, "round 0 closed")
        assert sorted(a["worker"] for a in record["applied"]) == ["w1", "w2"]
    finally:
        c.close()


@pytest.mark.slow
def test_workers_that_let_the_deadline_pass_stop_counting_towards_the_quorum(nats_server, procs, tmp_path) -> None:
    c, status, count = _setup(nats_server, procs, tmp_path, "3")
    try:
        push_delta(c, "w1", 0, np.random.default_rng(4).normal(0, 0.01, count).astype(np.float32))
        record = wait_for(lambda: c.run(c.store.get_json(protocol.round_key(0)))[0], 180, "round 0 closed")
        assert [a["worker"] for a in record["applied"]] == ["w1"]
        assert "(quorum) at the deadline" in procs.log("coord")
    finally:
        c.close()


@pytest.mark.slow
def test_the_duplicate_delta_guard_keeps_its_rows_for_content_rounds_then_drops_them(
    nats_server, procs, peek, tmp_path
) -> None:
    """Before: one content.<sha256> row per accepted delta, for ever (the bucket holds 64 MiB;
    the coordinator stops once a write fails)."""
    status = tmp_path / "status.json"
    procs.start("coord", "coordinator", "--nats", nats_server.url, "--rounds", "8", "--min-deltas", "1",
                "--round-timeout", "5", "--content-rounds", "2", "--status-file", str(status))  # fmt: skip
    wait_for(status.exists, 180, "the coordinator's first status")
    procs.start("w", "client", "--nats", nats_server.url, "--worker-id", "w")
    assert procs.wait("coord", 300) == 0, procs.log("coord")[-2000:]
    p = peek()
    rounds = {}
    for key in p.run(p.store.keys("content.")):
        row = p.get(key)
        assert row is not None and row["worker"] == "w"
        rounds[row["round"]] = key
    # rounds 0-7 were applied; the rows of the last two stay
    assert sorted(rounds) == [6, 7]
    assert sorted(p.run(p.store.keys("contents."))) == ["contents.6", "contents.7"]
    # and the pruned ones left no purge marker behind (a marker takes about the room of a row)
    info = p.run(p.store.js.stream_info("KV_ERANCLOUD", subjects_filter="$KV.ERANCLOUD.content.>"))
    assert info.state.subjects is not None and len(info.state.subjects) == 2
