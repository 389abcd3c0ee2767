"""NATS going away under a running coordinator and worker (real nats-server, stopped and
started again on the same port and JetStream directory): an outage shorter than
--outage-window is ridden out and training resumes; a longer one ends both with exit 4,
the URL and the cause, no traceback, and the round state intact (before: an 8 s outage
ended the coordinator with exit 1 and a TypeError traceback from nats-py's close)."""

from __future__ import annotations

import signal
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


def _coordinator(url: str, procs, tmp_path) -> None:
    procs.start("coord", "coordinator", "--nats", url, "--rounds", "50", "--min-deltas", "1",
                "--outage-window", "300", "--status-file", str(tmp_path / "status.json"))  # fmt: skip
    wait_for((tmp_path / "status.json").exists, 180, "the coordinator")


def _frozen_while_the_worker_starts(url: str, procs, frozen, what: str) -> None:
    """``frozen`` (the server or the coordinator) is stopped, as a loaded machine stalls it,
    while a worker with 1 s calls starts; thawed once the worker has seen its first call time
    out (or has exited). The worker must then push its round."""
    frozen.send_signal(signal.SIGSTOP)
    try:
        procs.start("w", "client", "--nats", url, "--worker-id", "w", "--rounds", "1",
                    "--timeout", "1", "--register-timeout", "1")  # fmt: skip
        wait_for(lambda: f"({what}): timed out" in procs.log("w") or procs.procs["w"].poll() is not None,
                 120, f"the worker's first {what} timing out")  # fmt: skip
    finally:
        frozen.send_signal(signal.SIGCONT)
    assert procs.wait("w", 180) == 0, procs.log("w")[-2000:]
    assert "delta pushed" in procs.log("w"), procs.log("w")[-2000:]


def test_a_server_slower_than_the_first_connect_is_waited_for(nats_server, procs, tmp_path) -> None:
    # Before: the worker's connect had one --timeout in all and exited 4 ("timed out").
    _coordinator(nats_server.url, procs, tmp_path)
    _frozen_while_the_worker_starts(nats_server.url, procs, nats_server.proc, "connect")


def test_a_coordinator_slower_than_the_registration_timeout_is_waited_for(nats_server, procs, tmp_path) -> None:
    # Before: a registration that timed out counted as "no coordinator running" and the worker
    # gave up after --register-timeout, though the coordinator was there, only busy.
    _coordinator(nats_server.url, procs, tmp_path)
    _frozen_while_the_worker_starts(nats_server.url, procs, procs.procs["coord"], "register")


PROBE = """
import asyncio, sys
import nats, nats.errors
async def main():
    nc = await nats.connect(sys.argv[1])
    try:
        await nc.request(sys.argv[2], b"{}", timeout=2)
        print("answered")
    except nats.errors.NoRespondersError:
        print("no responders")
    except nats.errors.TimeoutError:
        print("timeout")
    await nc.close()
asyncio.run(main())
"""


def test_the_status_file_is_written_only_once_the_server_holds_the_registration_subscription(
    nats_server, tmp_path, monkeypatch
) -> None:
    """Readiness is the status file: a worker started once it exists must not meet "no
    responders" (under load it did: the file was written before the subscription reached the
    server, and a worker with --register-timeout 1 gave up on a coordinator that was there).
    The probe runs while the coordinator is held inside its first status write, so what it
    sees is the server's view alone: "timeout" (forwarded to the held coordinator), never
    "no responders"."""
    import asyncio
    import subprocess
    import sys

    from erancloud import coordinator

    class Held(Exception):
        pass

    seen: list[str] = []

    def probe(self: coordinator.Coordinator) -> None:
        subject = f"{protocol.REGISTER_PREFIX}.probe"
        r = subprocess.run([sys.executable, "-c", PROBE, nats_server.url, subject],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        seen.append(r.stdout.strip() or r.stderr[-500:])
        raise Held

    monkeypatch.setattr(coordinator.Coordinator, "write_status", probe)
    cfg = coordinator.Config(rounds=1, status_path=tmp_path / "status.json")
    with pytest.raises(Held):
        asyncio.run(coordinator.run(nats_server.url, cfg, lambda _: None))
    assert seen == ["timeout"]
