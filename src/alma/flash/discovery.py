"""Find NVIDIA boards on USB through libudev (pyudev), the way labgrid's USB resources do:
match udev properties/attributes of ``usb_device`` nodes against a table.

What can be seen on the bus:

- ``0955:<APX pid>``: a Jetson in recovery mode (the BootROM), ready for ``initrd-flash``;
- ``1d6b:0104`` "Linux for Tegra" with configuration ``UMS``: the initrd-flash kernel's
  mass-storage gadget (``flashpkg`` or the exported rootfs device): a flash in progress;
- ``1d6b:0104`` "Linux for Tegra" otherwise, or ``0955:7020``: a booted L4T board in USB
  device mode.

An empty listing is not proof of absence: a board that is powered off, not in recovery
mode, on a charge-only cable or behind a flaky hub does not enumerate at all.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyudev

from alma.errors import UserError
from alma.flash.pids import (
    GADGET_PRODUCT,
    GADGET_VENDOR,
    L4T_DEVICE_MODE_PRODUCT,
    NVIDIA_VENDOR,
    BoardState,
    module_for,
)
from alma.flash.pids import is_usb_instance as is_usb_instance  # re-exported: session uses it from here

SPEEDS = {
    "1.5": "low-speed (USB 1.0)",
    "12": "full-speed (USB 1.1)",
    "480": "high-speed (USB 2.0)",
    "5000": "SuperSpeed (USB 3.0)",
    "10000": "SuperSpeed+ (USB 3.1)",
    "20000": "SuperSpeed+ (USB 3.2x2)",
}

NO_BOARD_HELP = """\
No Jetson in recovery mode was seen on USB. An empty listing is not proof that no board is
connected: a board that is off, running, or on a charge-only cable does not show up here.
To put an Orin into recovery mode:
  1. Power it off (AGX: hold Power; Orin Nano/NX devkit: remove the DC jack).
  2. Orin Nano/NX devkit: jumper FC_REC (pin 10) to GND (pin 9) on the J14 button header,
     then apply power. AGX Orin devkit: hold Force Recovery (middle button), press and
     release Power (left) or Reset (right), then release Force Recovery.
  3. Connect the board's USB-C flashing port (AGX: the port next to the 40-pin header;
     Orin Nano/NX devkit: the USB-C port) to a port directly on this host, not a hub or
     dock, with a data cable (many USB-C cables are charge-only).
  4. Check again: alma boards --wait   (lsusb should show 0955:7xxx "NVIDIA Corp. APX")."""


@dataclass
class UsbBoard:
    """One NVIDIA-related device on the bus (a board in some state)."""

    usb_instance: str  # the sysfs name, e.g. "1-8.4": what initrd-flash --usb-instance takes
    vendor: str
    product: str
    state: str  # BoardState value
    description: str
    module: str | None = None
    soc: str | None = None
    pid_known: bool = False
    busnum: int | None = None
    devnum: int | None = None
    port_path: str | None = None  # "1-8.4": bus 1, root port 8, hub port 4
    via_hub: bool = False
    speed_mbps: str | None = None
    speed: str | None = None
    devnode: str | None = None
    serial: str | None = None
    sys_path: str = ""
    exports: list[str] = field(default_factory=list)  # flashpkg / nvme0n1 / mmcblk0 while flashing

    @property
    def in_recovery(self) -> bool:
        return self.state == BoardState.RECOVERY.value

    def record_board(self) -> dict[str, Any]:
        """The ``board`` part of a flash record (docs/formats.md)."""
        return {
            "usb_instance": self.usb_instance,
            "vendor": self.vendor,
            "product": self.product,
            "module": self.module,
            "soc": self.soc,
            "serial": self.serial,
            "speed": self.speed,
            "via_hub": self.via_hub,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _attr(dev: pyudev.Device, name: str) -> str | None:
    try:
        val = dev.attributes.asstring(name)
    except (KeyError, UnicodeDecodeError, OSError):
        return None
    return val.strip() or None


def _int(val: str | None) -> int | None:
    try:
        return int(val) if val is not None else None
    except ValueError:
        return None


def _ids(dev: pyudev.Device) -> tuple[str, str]:
    vendor = _attr(dev, "idVendor") or dev.properties.get("ID_VENDOR_ID", "")
    product = _attr(dev, "idProduct") or dev.properties.get("ID_MODEL_ID", "")
    return vendor.lower(), product.lower()


def _is_root_hub(dev: pyudev.Device) -> bool:
    return dev.sys_name.startswith("usb")


def _exports(dev: pyudev.Device) -> list[str]:
    """SCSI vendor of the gadget's disks: initrd-flash writes the export name there."""
    out = []
    for child in dev.children:
        if child.subsystem == "block" and child.device_type == "disk":
            vendor = child.properties.get("ID_VENDOR") or _attr(child.find_parent("scsi") or child, "vendor")
            if vendor:
                out.append(vendor.strip())
    return sorted(set(out))


def describe(dev: pyudev.Device) -> UsbBoard | None:
    """A ``UsbBoard`` for an NVIDIA-related usb_device, or None for anything else."""
    vendor, product = _ids(dev)
    state: BoardState
    module = None
    exports: list[str] = []
    if vendor == NVIDIA_VENDOR:
        module = module_for(vendor, product)
        if module is not None:
            state, desc = BoardState.RECOVERY, f"{module.name} in recovery mode (APX)"
        elif product == L4T_DEVICE_MODE_PRODUCT:
            state, desc = BoardState.BOOTED, "Jetson running L4T (USB device mode)"
        else:
            state, desc = BoardState.RECOVERY, f"NVIDIA device 0955:{product} (product id not in the table)"
    elif vendor == GADGET_VENDOR and product == GADGET_PRODUCT:
        maker = _attr(dev, "manufacturer") or ""
        prod = _attr(dev, "product") or ""
        if "NVIDIA" not in maker and "Tegra" not in prod:
            return None  # some other Linux gadget
        config = _attr(dev, "configuration") or ""
        exports = _exports(dev)
        if config == "UMS" or exports:
            shown = ", ".join(exports) or "storage"
            state, desc = BoardState.FLASHING, f"initrd-flash gadget exporting {shown} (flash in progress)"
        else:
            state, desc = BoardState.BOOTED, "Jetson running L4T (USB device mode gadget)"
    else:
        return None

    busnum = _int(_attr(dev, "busnum"))
    devpath = _attr(dev, "devpath")
    instance = f"{busnum}-{devpath}" if busnum is not None and devpath else dev.sys_name
    parent = dev.find_parent("usb", "usb_device")
    via_hub = parent is not None and not _is_root_hub(parent)
    speed_raw = _attr(dev, "speed")
    return UsbBoard(
        usb_instance=instance,
        vendor=vendor,
        product=product,
        state=state.value,
        description=desc,
        module=module.name if module else None,
        soc=module.soc if module else None,
        pid_known=module is not None,
        busnum=busnum,
        devnum=_int(_attr(dev, "devnum")),
        port_path=instance,
        via_hub=via_hub,
        speed_mbps=speed_raw,
        speed=SPEEDS.get(speed_raw or "", f"{speed_raw} Mbit/s" if speed_raw else None),
        devnode=dev.device_node,
        serial=_attr(dev, "serial"),
        sys_path=dev.sys_path,
        exports=exports,
    )


def _boards(devices: Iterable[pyudev.Device]) -> list[UsbBoard]:
    out = [b for b in (describe(d) for d in devices) if b is not None]
    return sorted(out, key=lambda b: (b.busnum or 0, b.usb_instance))


def list_boards(context: pyudev.Context | None = None) -> list[UsbBoard]:
    """Every NVIDIA-related USB device libudev knows about right now."""
    ctx = context or pyudev.Context()
    return _boards(ctx.list_devices(subsystem="usb", DEVTYPE="usb_device"))


def recovery_boards(context: pyudev.Context | None = None) -> list[UsbBoard]:
    return [b for b in list_boards(context) if b.in_recovery]


def find_board(usb_instance: str, context: pyudev.Context | None = None) -> UsbBoard:
    boards = list_boards(context)
    for b in boards:
        if b.usb_instance == usb_instance:
            return b
    seen = ", ".join(f"{b.usb_instance} ({b.state})" for b in boards) or "none"
    raise UserError(
        f"no board at USB {usb_instance} (NVIDIA devices seen: {seen})",
        hint="alma boards  (lists the usb instances; an empty listing is not proof of absence)",
    )


def _monitor(ctx: pyudev.Context) -> pyudev.Monitor:
    mon = pyudev.Monitor.from_netlink(ctx)
    mon.filter_by("usb", "usb_device")
    mon.start()
    return mon


def _events(mon: pyudev.Monitor, deadline: float | None) -> Iterator[pyudev.Device]:
    """Devices from udev events until the deadline: blocks in poll(), no sleep loop."""
    poller = select.poll()
    poller.register(mon.fileno(), select.POLLIN)
    while True:
        wait_ms = None if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
        if not poller.poll(wait_ms):
            if deadline is not None and time.monotonic() >= deadline:
                return
            continue
        dev = mon.poll(timeout=0)
        if dev is not None:
            yield dev


def wait_for_boards(
    timeout: float | None,
    *,
    usb_instance: str | None = None,
    context: pyudev.Context | None = None,
    listening: Callable[[], None] | None = None,
) -> list[UsbBoard]:
    """Boards in recovery mode, waiting for a udev ``add`` event when there is none yet.

    Returns an empty list when ``timeout`` passes. The monitor starts before the first
    enumeration so a board plugged in between the two is not missed; ``listening`` is
    called once nothing is there yet and the monitor is waiting.
    """
    ctx = context or pyudev.Context()
    mon = _monitor(ctx)
    deadline = None if timeout is None else time.monotonic() + timeout

    def wanted(boards: list[UsbBoard]) -> list[UsbBoard]:
        return [b for b in boards if b.in_recovery and (usb_instance is None or b.usb_instance == usb_instance)]

    try:
        found = wanted(list_boards(ctx))
        if found:
            return found
        if listening is not None:
            listening()
        for dev in _events(mon, deadline):
            if dev.action not in ("add", "bind", "change"):
                continue
            board = describe(dev)
            if board is not None and wanted([board]):
                return [board]  # the caller lists again if it wants the whole bus
        return []
    finally:
        with contextlib.suppress(Exception):
            mon.stop()


class PresenceWatch:
    """Follows udev add/remove events at one USB port during a flash.

    A board re-enumerates several times while flashing (APX -> flashpkg gadget -> exported
    disk -> rebooted), always at the same port; only a removal that nothing replaced says
    the board vanished (cable, power, a hub resetting).
    """

    def __init__(self, usb_instance: str, context: pyudev.Context | None = None) -> None:
        self.usb_instance = usb_instance
        self._ctx = context or pyudev.Context()
        self._observer: pyudev.MonitorObserver | None = None
        self.gone_since: float | None = None  # monotonic time of the last unreplaced removal
        self.events: list[tuple[float, str]] = []

    def _on_event(self, dev: pyudev.Device) -> None:
        if dev.sys_name != self.usb_instance:
            return
        now = time.monotonic()
        self.events.append((now, dev.action or "?"))
        if dev.action == "remove":
            self.gone_since = now
        elif dev.action in ("add", "bind"):
            self.gone_since = None

    def start(self) -> PresenceWatch:
        try:
            mon = _monitor(self._ctx)
            self._observer = pyudev.MonitorObserver(mon, callback=self._on_event, name=f"presence {self.usb_instance}")
            self._observer.start()
        except OSError:  # no udev netlink here: the log alone will have to tell
            self._observer = None
        return self

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.send_stop()
            self._observer = None

    def gone_for(self) -> float | None:
        """Seconds the board has been gone from its port, or None if it is (back) there."""
        return None if self.gone_since is None else time.monotonic() - self.gone_since
