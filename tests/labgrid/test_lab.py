"""The loopback lab: the real labgrid-coordinator, the real exporter (alma-labgrid-exporter) whose
board is a umockdev device on a testbed bus, and real labgrid-client processes; the flash is
the simulated initrd-flash of tests/flash run by FlashSession on the exporter's side.

One lab per module (starting the processes is the slow part); the tests run in file order
and the last one kills the exporter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support_flash import sha256
from support_labgrid import DEADLINE_S, Lab, require_labgrid, wait_for

pytestmark = pytest.mark.slow
PLACE = "jetson-1"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_labgrid()
    lab = Lab(tmp_path_factory.mktemp("lab"))
    try:
        waiting = lab.base / "sim-waiting"
        lab.start_coordinator()
        lab.start_exporter(SIM_WAITING=str(waiting))
        lab.place(PLACE)
        yield lab
    finally:
        lab.close()


def _bundle(lab: Lab, name: str, **kw: object) -> Path:
    bundle = lab.client.bundle(name, **kw)
    lab.client.manifest(bundle)
    return bundle


def test_flash_through_the_coordinator_end_to_end(lab: Lab) -> None:
    """reserve → acquire → `labgrid-client -s flashed` (a second process) → release."""
    lab.ok("-p", PLACE, "set-tags", "board=orin-nano")
    out = lab.ok("reserve", "--shell", "board=orin-nano")
    token = out.strip().split("LG_TOKEN=", 1)[1].split()[0]
    lab.ok("wait", token)
    lab.ok("-p", "+", "acquire", LG_TOKEN=token)
    bundle = _bundle(lab, "ok")
    env = lab.env_file(PLACE, bundle)
    before = len(lab.station.records_list())
    r = lab.client_cmd("-c", str(env), "-p", PLACE, "-s", "flashed", "-v", "io", "get")
    assert r.returncode == 0, r.stderr[-3000:]
    records = lab.station.records_list()
    assert len(records) == before + 1
    rec = records[-1]
    assert rec["result"] == "SUCCESS" and rec["final_status"] == "SUCCESS"
    assert rec["board"]["usb_instance"] == "1-3" and rec["tool"] == "alma flash"
    assert rec["bundle_sha256"] == sha256(bundle)  # verified on the exporter against the client's facts
    assert rec["bundle_path"] == str(bundle)  # in the exporter's bundle_dirs: used in place, not uploaded
    assert "flashed USB 1-3: record" in r.stderr
    # the strategy went through recovery: line held during a power cycle, released after
    assert (lab.base / "power.log").read_text().split() == ["off", "on"]
    assert (lab.base / "recovery-line").read_text() == "0\n"
    assert "low" in r.stdout, r.stdout
    lab.ok("-p", PLACE, "release")
    lab.ok("cancel-reservation", token)
    assert _holder(lab) is None
    # released: the flash service is gone from the published parameters
    wait_for("the service port to be withdrawn", lambda: "'port': None" in lab.client_cmd("-v", "resources").stdout)


def _holder(lab: Lab) -> str | None:
    for line in lab.ok("-p", PLACE, "show").splitlines():
        if line.strip().startswith("acquired:"):
            value = line.split(":", 1)[1].strip()
            return None if value == "None" else value
    raise AssertionError("labgrid-client show printed no acquired: line")


def test_two_clients_race_for_one_place(lab: Lab) -> None:
    """Both ask at once: the coordinator gives the place to exactly one, the other is told who has it."""
    racers = [lab.client_popen("-p", PLACE, "acquire", LG_USERNAME=f"racer{i}") for i in range(2)]
    results = [(p.wait(DEADLINE_S), *p.communicate()) for p in racers]
    codes = sorted(rc for rc, _, _ in results)
    assert codes[0] == 0 and codes[1] != 0, results
    loser = next(err for rc, _, err in results if rc != 0)
    assert "already acquired" in loser, loser
    assert _holder(lab) is not None
    lab.ok("-p", PLACE, "release", "--kick")
    assert _holder(lab) is None


def test_recovery_mode_is_reached_by_power_and_the_recovery_line(lab: Lab) -> None:
    """The board is off the bus (powered off); -s recovery: off, line held, on: it shows up in recovery."""
    lab.bus_command("remove")
    wait_for("the board to be off the bus", lambda: lab.resource("station-1", avail=False))
    env = lab.env_file(PLACE, _bundle(lab, "rec"))
    (lab.base / "power.log").unlink(missing_ok=True)
    lab.ok("-p", PLACE, "acquire")
    try:
        lab.ok("-c", str(env), "-p", PLACE, "-s", "recovery", "io", "get")
    finally:
        lab.ok("-p", PLACE, "release")
    assert (lab.base / "power.log").read_text().split() == ["off", "on"]
    assert lab.resource("station-1", avail=True)


def test_board_leaving_the_bus_makes_the_resource_unavailable_not_a_hang(lab: Lab) -> None:
    lab.bus_command("remove")
    wait_for("the coordinator to list the board unavailable", lambda: lab.resource("station-1", avail=False))
    bundle = _bundle(lab, "gone")
    env = lab.env_file(PLACE, bundle, strategy={"recovery_timeout": 3}, cabled=False)  # unplugged: power won't help
    lab.ok("-p", PLACE, "acquire")
    before = len(lab.station.records_list())
    # not a hang: client_cmd's own timeout would fail the test; the strategy gave up after 3 s
    r = lab.client_cmd("-c", str(env), "-p", PLACE, "-s", "flashed", "io", "get")
    assert r.returncode != 0
    assert "did not appear in recovery mode at USB 1-3 within 3 s" in r.stderr, r.stderr[-2000:]
    assert len(lab.station.records_list()) == before  # nothing was attempted
    lab.ok("-p", PLACE, "release")
    lab.bus_command("add")
    wait_for("the board to be listed available again", lambda: lab.resource("station-1", avail=True))


def test_exporter_killed_mid_flash(lab: Lab) -> None:
    """The client gets a clear error, the record on the exporter is INTERRUPTED, the place is released."""
    waiting = lab.base / "sim-waiting"
    waiting.unlink(missing_ok=True)
    bundle = _bundle(lab, "hang", outcomes={"*": "hang-storage"})
    env = lab.env_file(PLACE, bundle)
    lab.ok("-p", PLACE, "acquire")
    before = len(lab.station.records_list())
    client = lab.client_popen("-c", str(env), "-p", PLACE, "-s", "flashed", "io", "get")
    wait_for("the flash to wait for the board's storage", lambda: waiting.exists() and waiting.read_text().strip())
    assert lab.bus_command("kill KILL")["rc"] == -9
    rc = client.wait(DEADLINE_S)
    _, err = client.communicate()
    assert rc != 0
    assert "INTERRUPTED" in err and "onto USB 1-3" in err, err[-3000:]
    records = lab.station.records_list()
    assert len(records) == before + 1
    rec = records[-1]
    assert rec["result"] == "INTERRUPTED"
    assert [p["name"] for p in rec["phases"]][-1] == "storage"
    assert rec["logs"].get("host_log")  # the logs up to the interruption are kept
    # the holder releases the place; the coordinator forgot the dead exporter's board
    lab.ok("-p", PLACE, "release")
    assert _holder(lab) is None
    gone = lambda: "station-1/bench-1" not in lab.client_cmd("-vv", "resources").stdout  # noqa: E731
    wait_for("the board to leave the coordinator", gone)
