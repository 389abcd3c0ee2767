"""The blob decoder and the registration/push checks against generated hostile input: every
input either decodes to exactly what was encoded or is refused with a BadBlob / a reason,
never another exception, never a partial value."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from erancloud import protocol, wire
from erancloud.errors import BadBlob
from erancloud.outer import Outer
from hypothesis import given, settings
from hypothesis import strategies as st

COUNT = 50


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_are_refused_cleanly(blob: bytes) -> None:
    for kind in ("model", "delta"):
        with pytest.raises(BadBlob):
            wire.decode_vector(blob, kind, COUNT)
    with pytest.raises(BadBlob):
        wire.decode_shard(blob, 64, 10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=COUNT, max_size=COUNT),
       st.integers(0, 300), st.integers(0, 255))  # fmt: skip
@pytest.mark.slow
def test_roundtrip_and_every_single_byte_flip(values: list[float], pos: int, mask: int) -> None:
    vec = np.array(values, np.float32)
    blob = wire.encode_vector("delta", vec, worker="w", round=3)
    out, header = wire.decode_vector(blob, "delta", COUNT)
    assert np.array_equal(out, vec) and header["worker"] == "w"
    pos %= len(blob)
    flipped = blob[:pos] + bytes([blob[pos] ^ (mask or 1)]) + blob[pos + 1 :]
    assert wire.sha256(flipped) != wire.sha256(blob)  # the push record's hash catches any flip
    with contextlib.suppress(BadBlob):  # decodes or is refused; either way the hash differs
        wire.decode_vector(flipped, "delta", COUNT)


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda b: b[:-4], "payload is"),
        (lambda b: b + b"\0\0\0\0", "payload is"),
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: b[:4] + struct.pack("<I", 10**6) + b[8:], "header length"),
    ],
)
def test_truncated_padded_or_forged_headers(mutate, why) -> None:
    blob = wire.encode_vector("model", np.zeros(COUNT, np.float32))
    with pytest.raises(BadBlob, match=why):
        wire.decode_vector(mutate(blob), "model", COUNT)
    with pytest.raises(BadBlob, match="expected"):
        wire.decode_vector(blob, "delta", COUNT)  # a model where a delta is expected
    nan = np.zeros(COUNT, np.float32)
    nan[3] = np.inf
    with pytest.raises(BadBlob, match="non-finite"):
        wire.decode_vector(wire.encode_vector("delta", nan), "delta", COUNT)


def test_shards_out_of_range() -> None:
    x = np.full((3, 64), 16, np.uint8)
    y = np.array([0, 9, 5], np.uint8)
    xs, ys, _ = wire.decode_shard(wire.encode_shard(x, y, 10), 64, 10)
    assert xs.max() == 1.0 and list(ys) == [0, 9, 5]
    with pytest.raises(BadBlob, match="pixel"):
        wire.decode_shard(wire.encode_shard(x + 1, y, 10), 64, 10)
    with pytest.raises(BadBlob, match="label"):
        wire.decode_shard(wire.encode_shard(x, np.array([0, 10, 1], np.uint8), 10), 64, 10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.none() | st.booleans() | st.integers() | st.text(max_size=70)
                       | st.dictionaries(st.text(max_size=12), st.integers() | st.text(max_size=40), max_size=4),
                       max_size=5), st.text(max_size=70))  # fmt: skip
def test_registration_check_refuses_or_cleans(req: dict, subject_tail: str) -> None:
    worker_id = protocol.worker_from_subject(f"{protocol.REGISTER_PREFIX}.{subject_tail}")
    out = protocol.check_registration(worker_id, req)
    if isinstance(out, str):
        return
    worker, caps = out
    assert worker == subject_tail and protocol.WORKER_ID.match(worker) and set(caps) <= set(protocol.CAPABILITIES)
    assert req["v"] == 1 and req.get("worker", worker) == worker


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_push_keys_parse_strictly(key: str) -> None:
    parsed = protocol.parse_push_key(key)
    if parsed is not None:
        r, w = parsed
        assert key == f"push.{r}.{w}" or key.startswith("push.0")


def test_outer_step_is_nesterov_and_fedavg_is_the_mean() -> None:
    p = np.ones(4, np.float32)
    m = np.zeros(4, np.float32)
    d = [(np.full(4, 0.1, np.float32), 1.0), (np.full(4, 0.3, np.float32), 1.0)]
    new, mom = Outer(aggregate="mean").step(p, m, d)
    g = -0.2
    assert np.allclose(mom, g) and np.allclose(new, 1 - 0.7 * (g + 0.9 * g))
    fed, _ = Outer.fedavg(aggregate="mean").step(p, m, d)
    assert np.allclose(fed, 1.2)
    late, _ = Outer.fedavg(aggregate="mean").step(p, m, [d[0], (d[1][0], Outer().weight(1))])
    assert np.allclose(late, 1 + (0.1 + 0.75 * 0.3) / 2)  # scaled, not renormalised
    assert Outer().weight(2) == 0.0


def test_the_outer_step_over_rounds_is_diloco_s_torch_sgd_nesterov() -> None:
    """DiLoCo's outer step: the pseudo-gradient theta_old - mean(theta_workers) fed to
    torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True), written out as torch documents it
    (b_1 = g_1, b_t = mu b_{t-1} + g_t; theta -= lr (g_t + mu b_t)). Over several rounds, so
    heavy-ball (theta -= lr b_t) or a lost momentum would differ."""
    rng = np.random.default_rng(5)
    p = rng.normal(size=6).astype(np.float32)
    mom = np.zeros(6, np.float32)
    ref_p, buf = p.astype(np.float64), None
    outer = Outer(aggregate="mean")
    for _ in range(4):
        workers = [ref_p + rng.normal(scale=0.1, size=6) for _ in range(3)]
        deltas = [((w - ref_p).astype(np.float32), 1.0) for w in workers]
        g = ref_p - np.mean(workers, axis=0)
        buf = g if buf is None else 0.9 * buf + g
        ref_p = ref_p - 0.7 * (g + 0.9 * buf)
        p, mom = outer.step(p, mom, deltas)
        assert np.allclose(p, ref_p, atol=1e-5)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(protocol.TRAIN_LIMITS)),
                       st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)))  # fmt: skip
def test_a_lying_round_state_is_refused_before_training(train: dict) -> None:
    good = {"h": 20, "lr": 0.1, "batch": 32, "hidden": 32, "seed": 0, "inputs": 64, "classes": 10}
    row = {"round": 3, "model_sha256": "a" * 64, "train": {**good, **train}}
    reason = protocol.check_state(row)
    if reason is None:
        for key, (low, high) in protocol.TRAIN_LIMITS.items():
            assert low <= row["train"][key] <= high
    assert protocol.check_state({"round": 3, "model_sha256": "a" * 64, "train": good}) is None
    assert protocol.check_state({"round": -1, "model_sha256": "a" * 64, "train": good})
