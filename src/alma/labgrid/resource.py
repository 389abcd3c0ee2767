"""labgrid resources for a Jetson in recovery mode (docs/labgrid.md).

``AlmaRecoveryBoard`` is matched the way ``alma boards`` matches (alma.flash.discovery:
vendor 0955 and the recovery-mode product ids of alma.flash.pids), keyed by the USB path
(the sysfs name ``1-8.4``: what initrd-flash's ``--usb-instance`` takes). It is available
only while the board sits in recovery mode; a flash makes it re-enumerate (the flashpkg
gadget, then the booted system), so "unavailable" during a flash is the protocol, not a
fault. ``NetworkAlmaRecoveryBoard`` is what a client sees of one exported by
``alma-labgrid-exporter``: the USB facts plus the flash service's address on the exporter.
"""

from __future__ import annotations

import re
from typing import Any

import attr
from labgrid.factory import target_factory
from labgrid.resource.remote import RemoteUSBResource
from labgrid.resource.udev import USBResource

from alma.flash import discovery

# The sysfs name of a USB device: bus, then up to 7 port numbers (USB 3 allows depth 7).
USB_PATH = re.compile(r"^\d{1,3}-\d{1,3}(?:\.\d{1,3}){0,6}$")


def _check_usb_path(instance: Any, attribute: Any, value: str | None) -> None:
    if value is not None and not USB_PATH.fullmatch(value):
        raise ValueError(f"{attribute.name}: {value!r} is not a USB path like 1-8.4 (see `alma boards`)")


def _check_dirs(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(d, str) and d.startswith("/") for d in value):
        raise ValueError(f"{attribute.name}: a list of absolute directories expected, not {value!r}")


@target_factory.reg_resource
@attr.s(eq=False)
class AlmaRecoveryBoard(USBResource):
    """A Jetson Orin in recovery mode on this host's USB, at ``usb_path`` (or the only one)."""

    usb_path = attr.ib(default=None, validator=_check_usb_path)
    # The board's USB serial console on the station ("auto": the one next to it, or a port).
    console = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))
    # Exporter only: directories whose bundles the flash service may use in place when a client
    # names them by path (the same path on both hosts: shared storage). Empty: always uploaded.
    bundle_dirs = attr.ib(factory=list, validator=_check_dirs)

    def __attrs_post_init__(self) -> None:
        self.match["SUBSYSTEM"] = "usb"
        self.match["DEVTYPE"] = "usb_device"
        self.match.setdefault("ID_VENDOR_ID", "0955")
        super().__attrs_post_init__()
        self.timeout = 10.0

    def filter_match(self, device: Any) -> bool:
        board = discovery.describe(device)
        if board is None or not board.in_recovery or not board.pid_known:
            return False
        return self.usb_path is None or board.usb_instance == self.usb_path

    @property
    def board(self) -> discovery.UsbBoard | None:
        """The board as `alma boards` describes it, while it is in recovery mode."""
        dev = self._get_usb_device()
        return discovery.describe(dev) if dev is not None else None


@target_factory.reg_resource
@attr.s(eq=False)
class NetworkAlmaRecoveryBoard(RemoteUSBResource):
    """An ``AlmaRecoveryBoard`` on an exporter; ``port`` is its flash service there (while
    the place is acquired), ``flashing`` is true while a flash runs."""

    usb_path = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))
    module = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))
    port = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(int)))
    flashing = attr.ib(default=False, validator=attr.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        self.timeout = 10.0
        super().__attrs_post_init__()
