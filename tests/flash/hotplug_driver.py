"""Hotplug scenarios on a umockdev testbed; run under ``umockdev-wrapper`` (it preloads the
libudev/sysfs redirection). Used by tests/flash/test_hotplug.py and bench/bench_boards_wait.py.

    umockdev-wrapper python hotplug_driver.py SCENARIO

Prints one JSON object. The testbed is created before any pyudev monitor (umockdev must exist first)
and a device is removed by sending "remove" first, then removing it from the testbed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402

DEVICES = Path(__file__).resolve().parent / "devices"
HOST = "/sys/devices/pci0000:00/0000:00:14.0/usb1"


def _blocks(name: str) -> list[str]:
    return (DEVICES / f"{name}.umockdev").read_text().strip().split("\n\n")


def _add(tb: UMockdev.Testbed, block: str) -> str:
    assert tb.add_from_string(block + "\n")
    syspath = "/sys" + block.split("\n", 1)[0][3:].strip()
    tb.uevent(syspath, "add")
    return syspath


def _remove(tb: UMockdev.Testbed, syspath: str) -> None:
    tb.uevent(syspath, "remove")
    tb.remove_device(syspath)


def host_only(tb: UMockdev.Testbed) -> None:
    for block in _blocks("no-nvidia"):
        tb.add_from_string(block + "\n")


def scenario_add_wakes_wait() -> dict[str, object]:
    """A gadget (not a recovery board) appears first and must not end the wait; then an APX board."""
    from alma.flash import discovery

    tb = UMockdev.Testbed.new()
    host_only(tb)
    gadget = _blocks("flashpkg-gadget")[2].replace("/1-3", "/1-5").replace("001/012", "001/015")
    board = _blocks("apx-7523-orin-nano-8gb")[2]
    stamps: dict[str, float] = {}

    def plug() -> None:
        time.sleep(0.3)
        _add(tb, gadget)
        time.sleep(0.3)
        stamps["added"] = time.monotonic()
        _add(tb, board)

    threading.Thread(target=plug, daemon=True).start()
    t0 = time.monotonic()
    found = discovery.wait_for_boards(10)
    t1 = time.monotonic()
    return {
        "found": [b.to_dict() for b in found],
        "waited_s": t1 - t0,
        "latency_s": t1 - stamps.get("added", t1),
    }


def scenario_timeout() -> dict[str, object]:
    from alma.flash import discovery

    tb = UMockdev.Testbed.new()
    host_only(tb)
    t0 = time.monotonic()
    found = discovery.wait_for_boards(0.5)
    return {"found": [b.to_dict() for b in found], "waited_s": time.monotonic() - t0}


def scenario_remove() -> dict[str, object]:
    """A board is unplugged: it disappears from the listing; waiting for its instance times out."""
    from alma.flash import discovery

    tb = UMockdev.Testbed.new()
    host_only(tb)
    syspath = _add(tb, _blocks("apx-7523-orin-nano-8gb")[2])
    before = [b.usb_instance for b in discovery.list_boards()]
    _remove(tb, syspath)
    after = [b.usb_instance for b in discovery.list_boards()]
    found = discovery.wait_for_boards(0.4, usb_instance="1-3")
    return {"before": before, "after": after, "found": [b.to_dict() for b in found]}


def scenario_cli_wait() -> dict[str, object]:
    """Time from the udev add event to `alma boards --wait` (a separate process) returning."""
    tb = UMockdev.Testbed.new()
    host_only(tb)
    board = _blocks("apx-7523-orin-nano-8gb")[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "alma", "boards", "--wait", "--timeout", "20", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # no env=: the testbed set UMOCKDEV_DIR in the C environment, which os.environ lacks
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "waiting for a Jetson ...": the monitor is listening
    assert "waiting" in line, line
    time.sleep(float(os.environ.get("SETTLE", "0.2")))
    t_add = time.monotonic()
    _add(tb, board)
    out, err = proc.communicate(timeout=30)
    t_done = time.monotonic()
    return {"rc": proc.returncode, "out": json.loads(out), "latency_s": t_done - t_add, "stderr": err}


def scenario_poll_loop() -> dict[str, object]:
    """The anchor: a 1 s sleep-polling loop (find-jetson-usb style), measured the same way."""
    from alma.flash import discovery

    tb = UMockdev.Testbed.new()
    host_only(tb)
    board = _blocks("apx-7523-orin-nano-8gb")[2]
    stamps: dict[str, float] = {}

    def plug() -> None:
        time.sleep(float(os.environ.get("PLUG_AFTER", "0.37")))
        stamps["added"] = time.monotonic()
        _add(tb, board)

    threading.Thread(target=plug, daemon=True).start()
    while not discovery.recovery_boards():
        time.sleep(1.0)
    return {"latency_s": time.monotonic() - stamps["added"]}


def scenario_flash_vanish() -> dict[str, object]:
    """WHEN=write: the board is unplugged while its storage is written (initrd-flash hangs in
    make-sdcard): the record must say it vanished (udev saw it go). WHEN=storage: it goes
    away while initrd-flash waits for its storage device, which is what the host's own
    ``udisksctl power-off`` of the flashpkg gadget does anyway: not "vanished"."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: support_flash
    from support_flash import Station, sha256

    from alma.flash.session import FlashOptions, FlashSession

    tb = UMockdev.Testbed.new()
    host_only(tb)
    syspath = _add(tb, _blocks("apx-7523-orin-nano-8gb")[2])
    unplug = os.environ.get("UNPLUG", "1") == "1"
    when = os.environ.get("WHEN", "write")
    st = Station(Path(tempfile.mkdtemp(prefix="vanish-")))
    b = st.bundle(outcomes={"*": "hang-write" if when == "write" else "hang-storage"})
    opts = FlashOptions(
        bundle=b,
        sha256=sha256(b),
        board="1-3",
        console=None,
        timeouts={"flash": 4.0, "storage": 4.0},
        work_dir=st.work,
        records_dir=st.records,
        root=st.root,
    )

    fired: list[bool] = []

    def on_event(kind: str, data: dict[str, object]) -> None:
        ev = data.get("event")
        line = str(getattr(ev, "line", ""))
        trigger = ("  Writing " in line) if when == "write" else getattr(ev, "banner", False)
        if (
            unplug
            and not fired
            and kind == "line"
            and trigger
            and getattr(ev, "phase", "") == ("flash" if when == "write" else "storage")
        ):
            fired.append(True)
            threading.Thread(target=lambda: (time.sleep(0.3), _remove(tb, syspath)), daemon=True).start()

    try:
        runs = FlashSession(opts, on_event=on_event).run()
    finally:
        shutil.rmtree(st.base, ignore_errors=True)
    rec = runs[0].record
    return {"result": rec.result, "reason": rec.reason, "phases": [p.name for p in rec.phases]}


if __name__ == "__main__":
    scenario = sys.argv[1].replace("-", "_")
    print(json.dumps(globals()[f"scenario_{scenario}"]()))
