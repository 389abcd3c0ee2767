"""The inner optimizer and its schedule (erancloud.inner): DiLoCo's inner side as the
worker and the coordinator run it, chosen by the coordinator's flags and carried in the
round state; a state written before these fields existed trains as it did."""

from __future__ import annotations

import json

import numpy as np
import pytest
from erancloud import inner, protocol
from erancloud.inner import InnerOpt, Schedule
from erancloud.model import MLP, train_local
from erancloud.outer import Outer
from support_erancloud import wait_for


def test_the_schedule_warms_up_linearly_then_decays_to_zero_by_cosine() -> None:
    s = Schedule(0.4, warmup=10, kind="cosine", total=110)
    assert [round(s.at(k), 6) for k in (0, 4, 9)] == [0.04, 0.2, 0.4]
    assert s.at(60) == pytest.approx(0.2)  # half way through the decay
    assert s.at(109) < 0.001 and s.at(500) == 0.0
    assert Schedule(0.1).at(0) == Schedule(0.1).at(10_000) == 0.1


def test_nesterov_and_adamw_follow_their_update_rules_and_keep_state_across_calls() -> None:
    g = np.array([1.0, -2.0], np.float32)
    p = np.zeros(2, np.float32)
    opt = InnerOpt("nesterov")
    opt.step(p, g, 0.1)  # m = g; p -= lr (g + 0.9 m)
    np.testing.assert_allclose(p, -0.1 * 1.9 * g, rtol=1e-6)
    opt.step(p, g, 0.1)  # m = 1.9 g
    np.testing.assert_allclose(p, -0.1 * 1.9 * g - 0.1 * (g + 0.9 * 1.9 * g), rtol=1e-6)
    q = np.ones(2, np.float32)
    adam = InnerOpt("adamw")
    adam.step(q, g, 0.01)  # bias-corrected first step: m/sqrt(v) = sign(g)
    np.testing.assert_allclose(q, 1 - 0.01 * (np.sign(g) + 0.1), rtol=1e-5)
    with pytest.raises(ValueError):
        InnerOpt("lion")


def test_a_worker_s_optimizer_state_carries_into_its_next_round() -> None:
    from erancloud import data

    x, y = data.load_digits()
    xs, ys = x[:200].astype(np.float32) / 16, y[:200].astype(np.int64)
    m = MLP()
    p0 = m.init(0)
    kept = InnerOpt("nesterov")
    train_local(m, p0, xs, ys, steps=5, lr=0.05, batch=32, seed=1, round_no=0, opt=kept)
    carried, _, _ = train_local(m, p0, xs, ys, steps=5, lr=0.05, batch=32, seed=1, round_no=1, opt=kept)
    fresh, _, _ = train_local(m, p0, xs, ys, steps=5, lr=0.05, batch=32, seed=1, round_no=1, opt=InnerOpt("nesterov"))
    assert not np.allclose(carried, fresh)
    # plain SGD (the default) has no state: the same inputs give the same update
    a, _, _ = train_local(m, p0, xs, ys, steps=5, lr=0.05, batch=32, seed=1, round_no=1)
    b, _, _ = train_local(m, p0, xs, ys, steps=5, lr=0.05, batch=32, seed=1, round_no=1, opt=InnerOpt("sgd"))
    np.testing.assert_array_equal(a, b)


def test_the_schedule_runs_on_the_global_step_round_times_h_plus_step() -> None:
    from erancloud import data

    x, y = data.load_digits()
    xs, ys = x[:200].astype(np.float32) / 16, y[:200].astype(np.int64)
    m = MLP()
    p0 = m.init(0)
    # warmup 40 global steps, H = 20: round 0 trains at lr 0.1 * (k+1)/40 and round 5 at the peak
    warm = Schedule(0.1, warmup=40)
    late, _, _ = train_local(m, p0, xs, ys, steps=20, lr=0.1, batch=32, seed=1, round_no=5, schedule=warm)
    peak, _, _ = train_local(m, p0, xs, ys, steps=20, lr=0.1, batch=32, seed=1, round_no=5)
    np.testing.assert_array_equal(late, peak)
    early, _, _ = train_local(m, p0, xs, ys, steps=20, lr=0.1, batch=32, seed=1, round_no=0, schedule=warm)
    plain, _, _ = train_local(m, p0, xs, ys, steps=20, lr=0.1, batch=32, seed=1, round_no=0)
    assert np.linalg.norm(early - p0) < 0.7 * np.linalg.norm(plain - p0)


def test_the_round_state_s_inner_fields_are_checked_and_old_states_train_as_before() -> None:
    train = {"h": 20, "lr": 0.1, "batch": 32, "hidden": 32, "seed": 0, "inputs": 64, "classes": 10}
    row = {"round": 0, "model_sha256": "0" * 64, "train": train}
    assert protocol.check_state(row) is None
    assert inner.from_train(train) == ("sgd", Schedule(0.1))
    for bad in ({"inner": "lion"}, {"schedule": "step"}, {"warmup": -1}, {"total_steps": True}):
        assert protocol.check_state({**row, "train": {**train, **bad}}) is not None, bad
    ok = {**train, "inner": "adamw", "warmup": 5, "schedule": "cosine", "total_steps": 100}
    assert protocol.check_state({**row, "train": ok}) is None
    assert inner.from_train(ok) == ("adamw", Schedule(0.1, 5, "cosine", 100))


def test_diloco_s_pairing_trains_the_digits_model() -> None:
    """Nesterov inner steps (state kept per worker) under the outer Nesterov step, warmup and
    cosine: the product's path, four non-IID workers, 12 rounds."""
    from erancloud import data
    from erancloud.model import hash_worker

    x, y = data.load_digits()
    (xt, yt), shards = data.split(x, y, 4)
    sh = [(a.astype(np.float32) / 16, b.astype(np.int64)) for a, b in shards]
    m, outer = MLP(), Outer(lr=1.0, momentum=0.5, aggregate="mean")
    p, mom = m.init(0), np.zeros(m.count, np.float32)
    opts = [InnerOpt("nesterov") for _ in sh]
    sched = Schedule(0.05, warmup=20, kind="cosine", total=12 * 20)
    for r in range(12):
        deltas = []
        for i, (a, b) in enumerate(sh):
            local, _, _ = train_local(m, p, a, b, steps=20, lr=0.05, batch=32, seed=hash_worker(f"w{i}"),
                                      round_no=r, opt=opts[i], schedule=sched)  # fmt: skip
            deltas.append((local - p, 1.0))
        p, mom = outer.step(p, mom, deltas)
    assert m.accuracy(p, xt.astype(np.float32) / 16, yt.astype(np.int64)) >= 0.9


@pytest.mark.slow
def test_the_coordinator_s_flags_reach_the_round_state_and_a_worker_trains_with_them(
    nats_server, procs, peek, tmp_path
) -> None:
    url = nats_server.url
    procs.start("coord", "coordinator", "--nats", url, "--rounds", "3", "--min-deltas", "1", "--round-timeout", "5",
                "--inner", "adamw", "--lr", "0.004", "--warmup-steps", "10", "--schedule", "cosine",
                "--outer-lr", "1.0", "--outer-momentum", "0.5",
                "--status-file", str(tmp_path / "status.json"))  # fmt: skip
    wait_for((tmp_path / "status.json").exists, 180, "the coordinator")
    procs.start("w", "client", "--nats", url, "--worker-id", "w")
    assert procs.wait("coord", 240) == 0, procs.log("coord")[-2000:]
    assert procs.wait("w", 120) == 0, procs.log("w")[-2000:]
    st = wait_for(lambda: peek().state(), 60, "the round state")
    assert st["phase"] == "finished"
    assert {k: st["train"][k] for k in ("inner", "warmup", "schedule", "total_steps")} == {
        "inner": "adamw", "warmup": 10, "schedule": "cosine", "total_steps": 60}  # fmt: skip
    assert (st["outer"]["lr"], st["outer"]["momentum"]) == (1.0, 0.5)
    assert json.loads(procs.stdout("w"))["rounds"] == 3


@pytest.mark.slow
def test_a_coordinator_restarted_for_more_rounds_stretches_the_schedule_to_them(
    nats_server, procs, peek, tmp_path
) -> None:
    """The latest coordinator's --rounds wins; the cosine ended with the first one's: the added
    rounds trained at lr 0, every delta all zeros, all but one refused as duplicates."""
    status = tmp_path / "status.json"
    common = ("--nats", nats_server.url, "--h-steps", "5", "--min-deltas", "1", "--round-timeout", "600",
              "--schedule", "cosine", "--status-file", str(status))  # fmt: skip
    procs.start("coord", "coordinator", "--rounds", "2", *common)
    wait_for(status.exists, 180, "the first coordinator")
    procs.procs["coord"].terminate()
    procs.wait("coord", 120)
    procs.start("coord2", "coordinator", "--rounds", "6", *common)
    st = wait_for(lambda: (s := peek().state()).get("rounds") == 6 and s, 180, "the restarted coordinator's rounds")
    _, schedule = inner.from_train(st["train"])
    assert all(schedule.at(step) > 0 for step in range(6 * 5)), [schedule.at(step) for step in range(6 * 5)]
