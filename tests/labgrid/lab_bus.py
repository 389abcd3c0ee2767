"""One flashing station's USB bus for the loopback lab: run under ``umockdev-wrapper``.

    umockdev-wrapper python lab_bus.py DEVICE -- EXPORTER_ARGV...

Creates a umockdev testbed holding the host controller and the recovery-mode board of
tests/flash/devices/DEVICE.umockdev, then runs the exporter as its child (it and the flash
service it starts see the testbed: real libudev, real udev events). Commands on stdin, one a
line, each answered on stdout with one JSON line:

    remove        the board leaves the bus ("remove" event, then gone from the testbed)
    add           it comes back
    kill SIGNAL   send SIGNAL (e.g. KILL, TERM) to the exporter, wait for it to exit
    quit          stop the exporter (TERM, then KILL) and exit

The first line printed is {"exporter": PID}. EOF on stdin acts as quit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402

DEVICES = Path(__file__).resolve().parent.parent / "flash" / "devices"


def say(obj: dict[str, object]) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    device, sep, *argv = sys.argv[1:]
    assert sep == "--" and argv, __doc__
    blocks = (DEVICES / f"{device}.umockdev").read_text().strip().split("\n\n")
    tb = UMockdev.Testbed.new()
    for block in blocks[:-1]:  # host controller and root hub
        assert tb.add_from_string(block + "\n")
    board = blocks[-1]
    syspath = "/sys" + board.split("\n", 1)[0][3:].strip()
    assert tb.add_from_string(board + "\n")
    # Started without env=: the testbed set UMOCKDEV_DIR in the C environment only.
    exporter = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr)  # stdout: ours, JSON only
    say({"exporter": exporter.pid})
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "remove":
                tb.uevent(syspath, "remove")
                tb.remove_device(syspath)
                say({"removed": syspath})
            elif cmd[0] == "add":
                assert tb.add_from_string(board + "\n")  # emits the "add" event itself
                say({"added": syspath})
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
