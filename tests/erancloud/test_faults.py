"""A coordinator and four workers, each its own process, on a real nats-server with JetStream,
through 24 rounds while everything that can go wrong does: a worker SIGSTOPped mid-round and
continued later, one killed with kill -9 (and started again under the same id), the
coordinator killed with kill -9 mid-round (with deltas accepted and not yet applied) and
restarted, a duplicate push, stale pushes, pushes with corrupted deltas.

Afterwards the test replays the whole training from what JetStream kept: every round's model
must be exactly the outer step of the previous model over the deltas that round lists, no
(worker, round) may appear twice, no rejected delta may appear at all, and the model must
have gone on learning."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from erancloud import protocol, wire
from erancloud.model import MLP
from erancloud.outer import Outer
from erancloud.store import dump_row
from support_erancloud import wait_for

pytestmark = pytest.mark.slow

ROUNDS = 24
WORKERS = ["w1", "w2", "w3", "w4"]


def _verdict_after(p, round_no, worker, revision_before, timeout=30):
    """The coordinator's verdict on a push, written after ``revision_before``."""

    def fresh():
        entry = p.run(p.store.get_json(protocol.verdict_key(round_no, worker)))
        return entry[0] if entry[0] is not None and entry[1] > revision_before else None

    return wait_for(fresh, timeout, f"verdict on {worker}@{round_no}")


def _verdict_rev(p, round_no, worker):
    return p.run(p.store.get_json(protocol.verdict_key(round_no, worker)))[1]


def _attack(p, worker, round_no, record, blob=None):
    """Put a push record (and its object) straight into the store; returns the verdict."""
    before = _verdict_rev(p, round_no, worker)
    if blob is not None:  # into the worker's own bucket, where its deltas go
        p.run(p.store.inbox(worker, create=True))
        p.run(p.store.put_blob(record["object"], blob, bucket=protocol.inbox_bucket(worker)))
    value = record if isinstance(record, bytes) else dump_row(record)
    p.run(p.store.pushes.put(protocol.push_key(round_no, worker), value))
    return _verdict_after(p, round_no, worker, before)


def _delta_push(worker, round_no, base_sha, delta, corrupt=None):
    blob = wire.encode_vector("delta", delta, worker=worker, round=round_no, base_sha256=base_sha)
    sha = wire.sha256(blob)
    if corrupt == "flip":
        blob = blob[:-8] + bytes(b ^ 0xFF for b in blob[-8:])
    record = protocol.push_record(
        worker, round_no, base_sha, protocol.delta_object(round_no, worker, sha), sha, 100, 20
    )
    return record, blob


def test_training_survives_every_fault(nats_server, procs, peek, tmp_path):
    url = nats_server.url
    status_file = tmp_path / "status.json"
    coord_args = ["coordinator", "--nats", url, "--rounds", str(ROUNDS), "--min-deltas", "2",
                  "--round-timeout", "2", "--status-file", str(status_file)]  # fmt: skip
    procs.start("coord", *coord_args)
    wait_for(status_file.exists, 180, "the coordinator's status.json")
    for w in WORKERS:
        procs.start(w, "client", "--nats", url, "--worker-id", w,
                    env={"ERAN_GRID_CHECKPOINT_DIR": str(tmp_path / w / "checkpoint")})  # fmt: skip
    p = peek()
    count = MLP().count
    wait_for(lambda: p.state().get("round", 0) >= 2, 90, "round 2")

    # A worker frozen by ERAN-GRID (the owner came back) in the middle of a round.
    procs.procs["w2"].send_signal(signal.SIGSTOP)
    stopped_at = p.state()["round"]

    # Registered workers that misbehave in every way the threat model lists. A push is judged
    # once (a rewritten one is ignored), so each attack is its own worker's first push.
    attackers = iter([f"mallory{i}" for i in range(10)])
    for name in [f"mallory{i}" for i in range(10)]:
        reply = p.request(protocol.register_subject(name), {"v": 1, "worker": name, "capabilities": {"cpus": 1}})
        assert reply["accepted"], reply
    refused = p.request(protocol.register_subject("eve"), {"v": 1, "capabilities": {"hostname": "kitchen-pc"}})
    assert not refused["accepted"] and "owner" in refused["reason"]

    st = p.state()
    r, base = st["round"], st["model_sha256"]
    zero = np.zeros(count, np.float32)
    small = np.full(count, 1e-3, np.float32)

    m = next(attackers)
    rec, blob = _delta_push(m, r - 2, base, small)
    assert _attack(p, m, r - 2, rec, blob)["reason"].startswith("stale")
    m = next(attackers)
    rec, blob = _delta_push(m, r, "0" * 64, small)
    assert _attack(p, m, r, rec, blob)["reason"].startswith("model hash mismatch")
    r, base = p.state()["round"], p.state()["model_sha256"]
    m = next(attackers)
    rec, blob = _delta_push(m, r, base, small, corrupt="flip")
    assert _attack(p, m, r, rec, blob)["reason"].startswith("corrupt delta: sha256")
    nan = small.copy()
    nan[7] = np.nan
    huge = np.zeros(count * 4, np.float32)  # four times a delta: refused on its size, never fetched
    for bad, why in ((nan, "non-finite"), (np.full(count, 50.0, np.float32), "norm"), (zero[:-1], "values where"),
                     (huge, "more than the")):  # fmt: skip
        r, base = p.state()["round"], p.state()["model_sha256"]
        m = next(attackers)
        blob = wire._pack({"kind": "delta", "count": int(bad.size), "worker": m, "round": r},
                          np.ascontiguousarray(bad, "<f4").tobytes())  # fmt: skip
        sha = wire.sha256(blob)
        rec = protocol.push_record(m, r, base, protocol.delta_object(r, m, sha), sha, 100, 20)
        verdict = _attack(p, m, r, rec, blob)
        assert not verdict["accepted"] and verdict["reason"].startswith("corrupt delta") and why in verdict["reason"]
    r = p.state()["round"]
    m = next(attackers)
    assert _attack(p, m, r, b"{not json")["reason"].startswith("malformed push")
    # The same worker's push rewritten after its verdict: ignored, the verdict stands.
    first_verdict = p.get(protocol.verdict_key(r, m))
    rec, blob = _delta_push(m, r, p.state()["model_sha256"], small)
    p.run(p.store.put_blob(rec["object"], blob, bucket=protocol.inbox_bucket(m)))
    p.run(p.store.pushes.put(protocol.push_key(r, m), dump_row(rec)))
    wait_for(lambda: p.state().get("rejected", {}).get("rewritten push", 0) >= 1, 60, "the rewrite counted")
    assert p.get(protocol.verdict_key(r, m)) == first_verdict
    m = next(attackers)
    assert _attack(p, m, r + 5, b"{}")["reason"].startswith("future round")
    # Far ahead: no verdict row (pushing round after round must not fill the coordinator's
    # bucket with verdicts it never prunes); the push row is deleted, the refusal counted.
    far = r + 1000
    p.run(p.store.pushes.put(protocol.push_key(far, "mallory0"), b"{}"))
    wait_for(lambda: p.get(protocol.push_key(far, "mallory0")) is None, 120, "the far-future push dropped")
    assert p.get(protocol.verdict_key(far, "mallory0")) is None
    rec, blob = _delta_push("nobody", r, base, small)
    assert _attack(p, "nobody", r, rec, blob)["reason"].startswith("unknown worker")

    # A duplicate push: w1's accepted record of this round re-written with another delta.
    def w1_accepted():
        r_now = p.state()["round"]
        v = p.get(protocol.verdict_key(r_now, "w1"))
        rec_now = p.get(protocol.push_key(r_now, "w1"))
        return (r_now, rec_now) if v and v["accepted"] and rec_now else None

    r, w1_record = wait_for(w1_accepted, 60, "an accepted push of w1")
    assert not p.run(p.store.create_json(protocol.push_key(r, "w1"), w1_record))  # create-only: refused
    before = p.get(protocol.verdict_key(r, "w1"))
    rewrites = p.state().get("rejected", {}).get("rewritten push", 0)
    rec, blob = _delta_push("w1", r, w1_record["base_sha256"], small)
    p.run(p.store.put_blob(rec["object"], blob, bucket=protocol.inbox_bucket("w1")))
    p.run(p.store.pushes.put(protocol.push_key(r, "w1"), dump_row(rec)))  # forced: ignored
    wait_for(lambda: p.state().get("rejected", {}).get("rewritten push", 0) > rewrites, 60, "the rewrite counted")
    assert p.get(protocol.verdict_key(r, "w1")) == before

    # Let the frozen worker miss rounds, then continue it.
    wait_for(lambda: p.state()["round"] >= stopped_at + 2, 90, "two rounds without w2")
    procs.procs["w2"].send_signal(signal.SIGCONT)

    # kill -9 a worker; then kill -9 the coordinator in the middle of a round in which a delta
    # has been accepted and not yet applied (w3's absence keeps the round open to its deadline).
    procs.procs["w3"].kill()
    dead_at = p.state()["round"]

    def accepted_in_open_round():
        st_now = p.state()
        if st_now["round"] <= dead_at or st_now["phase"] != "open":
            return None
        v = p.get(protocol.verdict_key(st_now["round"], "w1"))
        return st_now["round"] if v and v["accepted"] and p.state()["round"] == st_now["round"] else None

    mid = wait_for(accepted_in_open_round, 60, "an accepted, unapplied delta")
    procs.procs["coord"].kill()
    assert procs.wait("coord") == -signal.SIGKILL
    procs.start("coord", *coord_args)
    # The restarted coordinator may take longer than the default 10 s to answer on a busy machine.
    procs.start("w3", "client", "--nats", url, "--worker-id", "w3", "--register-timeout", "90",
                env={"ERAN_GRID_CHECKPOINT_DIR": str(tmp_path / "w3" / "checkpoint")})  # fmt: skip

    assert procs.wait("coord", 180) == 0, procs.log("coord")[-3000:]
    for w in WORKERS:
        assert procs.wait(w, 60) == 0, procs.log(w)[-2000:]

    # -- replay the training from what JetStream kept --------------------------------------
    st = p.state()
    assert st["phase"] == "finished" and st["round"] == ROUNDS
    outer = Outer.from_json(st["outer"])
    seen: set[tuple[str, int]] = set()
    applied_in: dict[str, list[int]] = {w: [] for w in WORKERS}
    prev_sha = None
    for k in range(ROUNDS):
        row = p.get(protocol.round_key(k))
        assert row is not None, f"round {k} has no record"
        if prev_sha is not None:
            assert row["base_sha256"] == prev_sha
        base_blob, mom_blob = p.blob(protocol.model_key(k)), p.blob(protocol.momentum_key(k))
        assert wire.sha256(base_blob) == row["base_sha256"]
        assert wire.sha256(mom_blob) == row["base_momentum_sha256"]
        deltas = []
        for a in row["applied"]:
            pair = (a["worker"], a["round"])
            assert pair not in seen, f"{pair} applied twice"
            seen.add(pair)
            assert a["worker"] in WORKERS, f"round {k} applied {a['worker']}"
            assert 0 <= k - a["round"] <= outer.max_staleness
            assert a["weight"] == outer.weight(k - a["round"])
            blob = p.blob(a["object"])
            assert wire.sha256(blob) == a["sha256"]
            deltas.append((wire.decode_vector(blob, "delta", count)[0], a["weight"]))
            applied_in[a["worker"]].append(k)
        assert len(deltas) >= 2
        def own_update(round_no: int, sha: str) -> np.ndarray:
            """The coordinator's own update of a round, the reference aggregate's yardstick."""
            blob = p.blob(protocol.reference_key(round_no))
            assert wire.sha256(blob) == sha
            return wire.decode_vector(blob, "delta", count)[0]

        assert outer.aggregate == "reference"
        reference = own_update(k, row["reference"]["sha256"])
        references = [own_update(a["round"], a["reference_sha256"]) for a in row["applied"]]
        base = wire.decode_vector(base_blob, "model", count)[0]
        momentum = wire.decode_vector(mom_blob, "momentum", count)[0]
        new_p, _ = outer.step(base, momentum, deltas, reference, references)
        result = p.blob(protocol.model_key(k + 1))
        assert wire.sha256(result) == row["model_sha256"]
        assert np.array_equal(wire.decode_vector(result, "model", count)[0], new_p), (
            f"round {k}: model is not the outer step"
        )
        prev_sha = row["model_sha256"]
    assert st["model_sha256"] == prev_sha

    assert any(k > stopped_at + 1 for k in applied_in["w2"]), "the continued worker never contributed again"
    assert any(k > mid for k in applied_in["w3"]), "the restarted worker never contributed again"
    assert any(k == mid for ks in applied_in.values() for k in ks)  # the interrupted round was closed
    accuracy = st["accuracy"][-1][1]
    assert accuracy >= 0.85, st["accuracy"]
    assert st["accuracy"][-1][1] > st["accuracy"][0][1]
    # Verdicts given before the restart stand (a replayed push is not judged again).
    first = p.get(protocol.round_key(0))["applied"][0]
    assert p.get(protocol.verdict_key(first["round"], first["worker"]))["accepted"]
    rejected = st["rejected"]
    for why, n in (("corrupt delta", 5), ("malformed push", 1), ("future round", 2), ("unknown worker", 1),
                   ("model hash mismatch", 1)):  # fmt: skip
        assert rejected.get(why) == n, rejected
    # Ignored rewrites are counted as often as they are seen (a restart's replay sees them again).
    assert rejected.get("rewritten push", 0) >= 2, rejected
    fig = json.loads(status_file.read_text())
    # The attackers never had a delta applied: their registrations expired (--expire-rounds 10).
    assert fig["round"] == ROUNDS and fig["registered_workers"] == 4 and fig["dry_run_runs"] == 0
    assert p.get("worker.mallory0") is None
    assert fig["live_workers"] == 4 and "mallory" not in fig["live_worker_ids"]
