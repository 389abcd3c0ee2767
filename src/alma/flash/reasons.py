"""Turn an initrd-flash transcript into one line a technician can act on.

The patterns are the real script's and NVIDIA tools' messages (meta-tegra scarthgap
``initrd-flash.sh``, ``make-sdcard.sh``, ``tegrarcm_v2``), most specific first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

DIRECT_PORT = "use a USB port on the host itself (no hub, dock or USB3 add-in card) and a short data cable"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"might be timeout in USB write", re.I),
        "USB write timeout talking to the board's BootROM (tegrarcm_v2: 'might be timeout in USB write'); "
        + DIRECT_PORT,
    ),
    (
        re.compile(r"\[got flashpkg when expecting (?P<dev>\S+?)\]"),
        "unexpected gadget: the board exported flashpkg when {dev} was expected (the device side failed; "
        "see the device logs)",
    ),
    (
        re.compile(
            r"(dd: error writing '(?P<dev>/dev/\S+?)'.*(No such device|Input/output error|No space left))|"
            r"(No such device or address)|(ERR: cannot locate block device (?P<dev2>\S+))",
        ),
        "the board vanished from USB mid-flash (writing {dev}); check the cable and the board's power, " + DIRECT_PORT,
    ),
    (
        re.compile(r"ERR: No Jetson device in recovery mode found(?: at USB (?P<usb>\S+))?|ERR: Device not found"),
        "no Jetson in recovery mode at USB {usb}: put the board into recovery mode (alma boards shows it)",
    ),
    (
        re.compile(r"ERR: could not locate USB storage device|ERR: could not find (?P<dev>\S+)"),
        "the board's USB storage device {dev} never appeared",
    ),
    (re.compile(r"ERR: signing failed"), "signing the boot binaries failed (see the host log)"),
    (
        re.compile(r"ERR: RCM boot failed"),
        "RCM boot failed: the board did not accept the flashing kernel; " + DIRECT_PORT,
    ),
]

_WAITING = re.compile(r"Waiting for USB storage device (?P<dev>\S+) from (?P<src>[^.\s]+)\.\.\.")
_WAIT_JETSON = re.compile(r"Waiting for Jetson to appear")
_FINAL = re.compile(r"^Final status: (?P<status>.+?)\s*$")


def final_status(lines: Sequence[str]) -> str | None:
    for line in reversed(lines):
        m = _FINAL.match(line.strip())
        if m:
            return m["status"]
    return None


def _fmt(template: str, m: re.Match[str], usb_instance: str) -> str:
    groups = {k: v for k, v in m.groupdict().items() if v}
    dev = groups.get("dev") or groups.get("dev2") or "device"
    return template.format(dev=dev, usb=groups.get("usb") or usb_instance)


def reason_from_log(
    lines: Sequence[str],
    *,
    usb_instance: str = "?",
    timed_out_phase: str | None = None,
    timeout_s: float | None = None,
    waiting_for: str | None = None,
) -> str:
    """One line: why this flash did not succeed."""
    text = [ln.rstrip() for ln in lines if ln.strip()]
    for pattern, template in _PATTERNS:
        for line in text:
            m = pattern.search(line)
            if m:
                return _fmt(template, m, usb_instance)
    if timed_out_phase:
        within = f" within {timeout_s:.0f} s" if timeout_s is not None else ""
        limit = f" ({timeout_s:.0f} s)" if timeout_s is not None else ""
        # initrd-flash prints "Waiting for USB storage device X from S..." and its dots without a
        # newline, so the wait in progress is usually not a complete line: a complete one that
        # ends in "[/dev/sdX]" was resolved. The phase says what it waits for.
        dev = waiting_for
        for line in reversed(text):
            w = _WAITING.search(line)
            if w and "[" not in line[w.end() :]:
                dev = w["dev"]
                break
        if dev:
            return (
                f"storage device {dev} never appeared (initrd-flash was still 'Waiting for USB storage device "
                f"{dev}' at the {timed_out_phase} phase's limit{limit}); check the board's console, "
                "disable desktop automount, " + DIRECT_PORT
            )
        if any(_WAIT_JETSON.search(line) for line in text[-3:]) or timed_out_phase == "wait-board":
            return f"the board never showed up in recovery mode at USB {usb_instance}{within}"
        return f"no progress in phase {timed_out_phase}{within}: stopped initrd-flash"
    status = final_status(text)
    if status is not None and status != "SUCCESS":
        return f"the device reported 'Final status: {status}' (initrd-flash still exited 0); see the device logs"
    for line in text:
        if line.startswith(("ERR:", "ERROR:", "Error:")):
            return line
    return text[-1] if text else "initrd-flash printed nothing"
