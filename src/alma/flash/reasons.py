"""Turn an initrd-flash transcript into one line a technician can act on.

The patterns are the real script's and NVIDIA tools' messages (meta-tegra scarthgap
``initrd-flash.sh``, ``make-sdcard.sh``, ``find-jetson-usb.sh``, ``tegrarcm_v2``), most specific
first. A reason names the phase (protocol step) and what the script last waited for, and
never points at logs that do not exist (after ``[got flashpkg when expecting X]`` the
script exits before it fetches any device logs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from alma.flash.protocol import GOT_FLASHPKG, WAITING

DIRECT_PORT = "use a USB port on the host itself (no hub, dock or USB3 add-in card) and a short data cable"
STORAGE_CHECKS = (
    "check the cable and port (" + DIRECT_PORT + "), the board's serial console, that desktop automount is off"
)
NVME_HINT = "; on an AGX Orin whose NVMe was flashed before, retry with --erase-nvme"

_USB_WRITE = re.compile(r"might be timeout in USB write", re.I)
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
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


def _pending_wait(text: list[str], default: str | None) -> str | None:
    """The device of a 'Waiting for USB storage device X from S...' that never resolved."""
    joined = "".join(text[-50:])  # the wait and its dots may arrive in several pieces
    waits = list(WAITING.finditer(joined))
    if waits:
        last = waits[-1]
        if "[" not in joined[last.end() :]:
            return last["dev"]
        return default
    return default


def reason_from_log(
    lines: Sequence[str],
    *,
    usb_instance: str = "?",
    timed_out_phase: str | None = None,
    timeout_s: float | None = None,
    waiting_for: str | None = None,
    device_logs: bool = False,
    erase_nvme: bool = False,
) -> str:
    """One line: why this flash did not succeed."""
    text = [ln.rstrip() for ln in lines if ln.strip()]
    within = f" within {timeout_s:.0f} s" if timeout_s is not None else ""
    limit = f" ({timeout_s:.0f} s)" if timeout_s is not None else ""
    nvme = "" if erase_nvme else NVME_HINT
    usb_write = any(_USB_WRITE.search(ln) for ln in text)
    for line in text:
        g = GOT_FLASHPKG.search(line)
        if g:
            return (
                f"the board exported flashpkg when {g['dev']} was expected (storage phase): the device side failed "
                f"before exporting {g['dev']}; initrd-flash fetched no device logs in this case, so read the "
                "host log and the board's serial console" + nvme
            )
    if timed_out_phase == "flashpkg":
        cause = (
            "tegrarcm_v2 reported 'might be timeout in USB write' during RCM boot (rcm-boot.sh still exits 0), "
            if usb_write
            else "the board did not boot the flashing kernel after RCM boot (a USB timeout there is not reported: "
            "rcm-boot.sh always exits 0), "
        )
        return (
            f"the flashpkg USB gadget never appeared{within} (phase flashpkg, initrd-flash was 'Waiting for USB "
            f"storage device flashpkg'): {cause}" + DIRECT_PORT + nvme
        )
    if usb_write:
        return (
            "USB write timeout talking to the board's BootROM (tegrarcm_v2: 'might be timeout in USB write'); "
            + DIRECT_PORT
        )
    for pattern, template in _PATTERNS:
        for line in text:
            m = pattern.search(line)
            if m:
                return _fmt(template, m, usb_instance)
    if timed_out_phase:
        dev = _pending_wait(text, waiting_for)
        if timed_out_phase == "storage" or (dev and dev != "flashpkg"):
            dev = dev or waiting_for or "the rootfs device"
            return (
                f"storage device {dev} never appeared (initrd-flash was still 'Waiting for USB storage device "
                f"{dev}' at the {timed_out_phase} phase's limit{limit}); " + STORAGE_CHECKS + nvme
            )
        if dev:
            return (
                f"the flashpkg gadget did not come back (initrd-flash was 'Waiting for USB storage device flashpkg' "
                f"at the {timed_out_phase} phase's limit{limit}); check the board's serial console"
            )
        if any(_WAIT_JETSON.search(line) for line in text[-3:]) or timed_out_phase == "wait-board":
            return f"the board never showed up in recovery mode at USB {usb_instance}{within}"
        return f"no progress in phase {timed_out_phase}{within}: stopped initrd-flash"
    status = final_status(text)
    if status is not None and status != "SUCCESS":
        logs = "see the device logs" if device_logs else "the device sent no logs; see the host log"
        return f"the device reported 'Final status: {status}' (initrd-flash still exited 0); {logs}"
    for line in text:
        if line.startswith(("ERR:", "ERROR:", "Error:")):
            return line
    return text[-1] if text else "initrd-flash printed nothing"
