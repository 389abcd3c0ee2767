"""One flashing station's USB bus for the loopback lab: run under ``umockdev-wrapper``.

    umockdev-wrapper python lab_bus.py DEVICE FIFO -- EXPORTER_ARGV...

Creates a umockdev testbed holding the host controller and the recovery-mode board of
tests/flash/devices/DEVICE.umockdev, then runs the exporter as its child (it and the flash
service it starts see the testbed: real libudev, real udev events). Commands on stdin, one a
line, each answered on stdout with one JSON line:

    remove        the board leaves the bus ("remove" event, then gone from the testbed)
    add           it comes back
    kill SIGNAL   send SIGNAL (e.g. KILL, TERM) to the exporter, wait for it to exit
    quit          stop the exporter (TERM, then KILL) and exit

The first line printed is {"exporter": PID}. EOF on stdin acts as quit.

FIFO takes "add" and "remove" too, without replies: the board's power, as the lab's power and
recovery-line commands drive it (tests/support_labgrid.py: power off unplugs, power on with the
recovery line held plugs it in, in recovery mode). Adding a present board or removing an absent
one does nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402

DEVICES = Path(__file__).resolve().parent.parent / "flash" / "devices"


def say(obj: dict[str, object]) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    device, fifo, sep, *argv = sys.argv[1:]
    assert sep == "--" and argv, __doc__
    blocks = (DEVICES / f"{device}.umockdev").read_text().strip().split("\n\n")
    tb = UMockdev.Testbed.new()
    for block in blocks[:-1]:  # host controller and root hub
        assert tb.add_from_string(block + "\n")
    board = blocks[-1]
    syspath = "/sys" + board.split("\n", 1)[0][3:].strip()
    assert tb.add_from_string(board + "\n")
    lock = threading.Lock()
    present = [True]

    def plug(cmd: str) -> None:
        with lock:
            if cmd == "remove" and present[0]:
                tb.uevent(syspath, "remove")
                tb.remove_device(syspath)
                present[0] = False
            elif cmd == "add" and not present[0]:
                assert tb.add_from_string(board + "\n")  # emits the "add" event itself
                present[0] = True

    def power_lines() -> None:
        fd = os.open(fifo, os.O_RDWR)  # read-write: writers never block, we never see EOF
        with os.fdopen(fd, "r") as fh:
            for ln in fh:
                if ln.strip() in ("add", "remove"):
                    plug(ln.strip())

    os.mkfifo(fifo, 0o600)
    threading.Thread(target=power_lines, daemon=True).start()
    # Started without env=: the testbed set UMOCKDEV_DIR in the C environment only.
    exporter = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr)  # stdout: ours, JSON only
    say({"exporter": exporter.pid})
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] in ("remove", "add"):
                plug(cmd[0])
                say({cmd[0]: syspath})
            elif cmd[0] == "kill":
                exporter.send_signal(getattr(signal, f"SIG{cmd[1]}"))
                say({"killed": cmd[1], "rc": exporter.wait(60)})
            elif cmd[0] == "quit":
                break
    finally:
        if exporter.poll() is None:
            exporter.terminate()
            try:
                exporter.wait(20)
            except subprocess.TimeoutExpired:
                exporter.kill()
                exporter.wait(10)
    say({"quit": exporter.returncode})
    return 0


if __name__ == "__main__":
    sys.exit(main())
