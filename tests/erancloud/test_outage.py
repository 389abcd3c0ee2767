"""NATS going away under a running coordinator and worker (real nats-server, stopped and
started again on the same port and JetStream directory): an outage shorter than
--outage-window is ridden out and training resumes; a longer one ends both with exit 4,
the URL and the cause, no traceback, and the round state intact (before: an 8 s outage
ended the coordinator with exit 1 and a TypeError traceback from nats-py's close)."""

from __future__ import annotations

import time

import pytest
from erancloud import protocol
from support_erancloud import Peek, wait_for

pytestmark = pytest.mark.slow

WINDOW = 12


def test_short_outage_is_ridden_out_and_a_long_one_fails_closed(nats_server, procs, tmp_path) -> None:
    url = nats_server.url
    procs.start("coord", "coordinator", "--nats", url, "--rounds", "500", "--min-deltas", "1", "--round-timeout", "1",
                "--outage-window", str(WINDOW), "--status-file", str(tmp_path / "status.json"))  # fmt: skip
    wait_for((tmp_path / "status.json").exists, 180, "the coordinator")
    procs.start("a", "client", "--nats", url, "--worker-id", "a", "--outage-window", str(WINDOW), "--timeout", "2")

    def round_now() -> int:
        p = Peek(url)
        try:
            return int(p.state().get("round", 0))
        finally:
            p.close()

    wait_for(lambda: round_now() >= 2, 90, "round 2")
    nats_server.stop()
    time.sleep(3)  # well inside the window
    nats_server.start()
    before = round_now()
    wait_for(lambda: round_now() >= before + 2, 90, "training resuming after the outage")
    assert procs.procs["coord"].poll() is None and procs.procs["a"].poll() is None

    nats_server.stop()  # for good: past the window both fail closed
    for name in ("coord", "a"):
        assert procs.wait(name, WINDOW + 60) == 4, procs.log(name)[-2000:]
        log = procs.log(name)
        assert f"NATS at {url} unreachable for" in log and "Traceback" not in log, log[-2000:]
    nats_server.start()
    p = Peek(url)
    st = p.state()
    assert protocol.check_coordinator_state(st) is None and st["round"] >= before + 2
    p.close()
