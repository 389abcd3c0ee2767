"""initrd-flash's protocol, followed line by line: which phase a flash is in, and when the
board must be on USB.

From meta-tegra scarthgap ``initrd-flash.sh`` (pinned commit, docs/flash.md#phases):

- ``wait-board``: find-jetson-usb --wait polls forever for the board in recovery mode;
- ``sign`` (== Step 1), ``rcm-boot`` (== Step 2: ``rcm-boot.sh``, which always exits 0 because it
  ends with ``cd "$oldwd"``, so a USB timeout there is never an error line);
- ``flashpkg`` (== Step 3 until ``Waiting for USB storage device flashpkg from S...[/dev/sdX]``):
  the flashing initrd booted and exported its gadget; a USB timeout in RCM boot shows only
  as this wait never ending, so it has its own short limit;
- ``send-commands``: the host writes the command sequence to the gadget, then
  ``udisksctl power-off`` removes it: a removal the protocol itself causes;
- ``storage`` (== Step 4 until ``Waiting for USB storage device <ROOTFS_DEVICE> ...[/dev/sdX]``),
  the board exports its storage device; ``[got flashpkg when expecting X]`` ends it badly;
- ``flash``: make-sdcard partitions and writes; the board must stay on USB until
  ``[OK: /dev/sdX]``, after which the host powers the device off again (protocol);
- ``final-status`` (== Step 5): the board re-exports flashpkg with its status and logs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BANNER = re.compile(r"^== Step (?P<n>\d+): (?P<what>.+?) at (?P<when>\S+) ==\s*$")
STEP_PHASES = {
    "Signing binaries": "sign",
    "Boot Jetson via RCM": "rcm-boot",
    "Sending flash sequence commands": "flashpkg",
    "Writing partitions on internal storage device": "storage",
    "Writing partitions on external storage device": "storage",
    "Waiting for final status from device": "final-status",
}
PHASES = ("wait-board", "sign", "rcm-boot", "flashpkg", "send-commands", "storage", "flash", "final-status")
_FOUND = re.compile(r"\[/dev/[a-z]+\]")
_OK = re.compile(r"^\[OK: (?P<dev>/dev/\S+)\]")
WAITING = re.compile(r"Waiting for USB storage device (?P<dev>\S+) from (?P<src>[^.\s]+)\.\.\.")
GOT_FLASHPKG = re.compile(r"\[got flashpkg when expecting (?P<dev>\S+?)\]")


@dataclass
class Tracker:
    """Feed it every output piece; it calls ``on_phase(name)`` at each protocol step."""

    on_phase: Callable[[str], None]
    phase: str = "wait-board"
    clock: Callable[[], float] = time.monotonic
    # (start, end) monotonic windows in which the board must stay on USB (the write)
    present_windows: list[list[float | None]] = field(default_factory=list)
    got_flashpkg_instead: str | None = None
    last_wait: str | None = None  # the device the script last waited for
    seen_lines: int = 0

    def _enter(self, name: str) -> None:
        if name != self.phase:
            self.phase = name
            self.on_phase(name)

    def feed(self, piece: str) -> bool:
        """Returns True when ``piece`` was a step banner."""
        self.seen_lines += 1
        line = piece.strip()
        m = BANNER.match(line)
        if m:
            self._close_window()
            self._enter(STEP_PHASES.get(m["what"], f"step-{m['n']}"))
            return True
        w = WAITING.search(line)
        if w:
            self.last_wait = w["dev"]
        g = GOT_FLASHPKG.search(line)
        if g:
            self.got_flashpkg_instead = g["dev"]
        if _FOUND.search(line):
            if self.phase == "flashpkg":
                self._enter("send-commands")
            elif self.phase == "storage":
                self._enter("flash")
                self.present_windows.append([self.clock(), None])
        if _OK.match(line):
            self._close_window()  # next: the host's own power-off of the device
        return False

    def _close_window(self) -> None:
        if self.present_windows and self.present_windows[-1][1] is None:
            self.present_windows[-1][1] = self.clock()

    def must_be_present_at(self, t: float) -> bool:
        return any(s is not None and s <= t and (e is None or t <= e) for s, e in self.present_windows)
