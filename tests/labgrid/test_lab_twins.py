"""Two places that reach one board (a misconfigured lab: the board exported twice, as two
groups): the coordinator cannot know they are one board, so each place can be acquired and
each gets its own flash service. The board itself is still flashed once at a time: the second
flash is REFUSED by the board lock (``flock`` on the board's own USB device node, the lock of
``alma flash``), with a record saying so, while the first goes on untouched.

Real labgrid-coordinator, alma-labgrid-exporter and labgrid-client processes on loopback, as in
test_lab.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from support_labgrid import DEADLINE_S, Lab, require_labgrid, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_labgrid()
    lab = Lab(tmp_path_factory.mktemp("twins"))
    try:
        lab.start_coordinator()
        lab.start_exporter(groups=("bench-1", "bench-2"), SIM_WAITING=str(lab.base / "sim-waiting"))
        lab.place("twin-a", group="bench-1")
        lab.place("twin-b", group="bench-2")
        yield lab
    finally:
        lab.close()


def test_two_flashes_of_one_board_through_two_places(lab: Lab) -> None:
    waiting = lab.base / "sim-waiting"
    hang = lab.client.bundle("hang", outcomes={"*": "hang-storage"})
    lab.client.manifest(hang)
    env_a = lab.env_file("twin-a", hang)
    lab.ok("-p", "twin-a", "acquire")
    lab.ok("-p", "twin-b", "acquire")
    before = len(lab.station.records_list())
    first = lab.client_popen("-c", str(env_a), "-p", "twin-a", "-s", "flashed", "io", "get")
    try:
        wait_for("the first flash to wait for the board's storage", lambda: waiting.exists() and waiting.read_text())
        # the second place's power is not cabled to the board: its strategy finds it in recovery as it is
        env_b = lab.env_file("twin-b", hang, cabled=False)
        r = lab.client_cmd("-c", str(env_b), "-p", "twin-b", "-s", "flashed", "io", "get")
        assert r.returncode != 0
        assert "REFUSED" in r.stderr and "already being flashed" in r.stderr, r.stderr[-3000:]
        assert first.poll() is None, "the refused second flash disturbed the first"
        (refused,) = [r for r in lab.station.records_list()[before:] if r["result"] == "REFUSED"]
        assert refused["board"]["usb_instance"] == "1-3"
        assert "already being flashed" in str(refused["reason"])
    finally:
        first.send_signal(signal.SIGINT)  # the holder gives up: its service interrupts the flash
        first.wait(DEADLINE_S)
        first.communicate()
    results = lambda: sorted(r["result"] for r in lab.station.records_list()[before:])  # noqa: E731
    wait_for("the first flash's record", lambda: results() == ["INTERRUPTED", "REFUSED"])
    lab.ok("-p", "twin-a", "release")
    lab.ok("-p", "twin-b", "release")
