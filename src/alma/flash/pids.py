"""What an NVIDIA USB id says about the board behind it.

Recovery-mode (APX) product ids from NVIDIA's Jetson Linux docs and meta-tegra's
``find-jetson-usb`` (scarthgap); machines from meta-tegra's ``conf/machine/*.conf``. A
bundle is flashed to a board only when the bundle's MACHINE is one this board's module runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

NVIDIA_VENDOR = "0955"
# initrd-flash's device side exports a mass-storage gadget with the Linux Foundation id.
GADGET_VENDOR = "1d6b"
GADGET_PRODUCT = "0104"
GADGET_VENDOR_STRING = "flashpkg"
# A booted L4T board in USB device mode (RNDIS/ACM gadget): "Linux for Tegra".
L4T_DEVICE_MODE_PRODUCT = "7020"

CHIPID_T234 = "0x23"  # Orin (NVIDIA_CHIP in meta-tegra's tegra234.inc)


class BoardState(StrEnum):
    """labgrid-style states; discovery can see the first three, flash records the rest."""

    ABSENT = "absent"
    RECOVERY = "recovery"  # APX: BootROM waiting for RCM, ready for initrd-flash
    FLASHING = "flashing"  # the initrd-flash kernel exports the flashpkg gadget
    FLASHED = "flashed"
    BOOTED = "booted"  # L4T running (USB device mode) or seen on the console


@dataclass(frozen=True)
class Module:
    pid: str
    name: str
    soc: str
    chipid: str | None  # None: not flashable with an R36 bundle
    machines: tuple[str, ...]  # meta-tegra MACHINEs whose bundles fit this module

    @property
    def flashable(self) -> bool:
        return self.chipid is not None


_AGX = ("jetson-agx-orin-devkit", "jetson-agx-orin-devkit-industrial", "p3737-0000-p3701-0005")
MODULES: dict[str, Module] = {
    m.pid: m
    for m in (
        Module("7023", "Jetson AGX Orin (P3701-0000/-0005/-0008)", "T234", CHIPID_T234, _AGX),
        Module("7223", "Jetson AGX Orin 32GB (P3701-0004)", "T234", CHIPID_T234, ("p3737-0000-p3701-0004",)),
        Module(
            "7323",
            "Jetson Orin NX 16GB (P3767-0000)",
            "T234",
            CHIPID_T234,
            ("p3768-0000-p3767-0000", "p3509-a02-p3767-0000"),
        ),
        Module("7423", "Jetson Orin NX 8GB (P3767-0001)", "T234", CHIPID_T234, ("p3768-0000-p3767-0001",)),
        Module(
            "7523",
            "Jetson Orin Nano 8GB / devkit (P3767-0003/-0005)",
            "T234",
            CHIPID_T234,
            ("jetson-orin-nano-devkit", "jetson-orin-nano-devkit-nvme", "p3768-0000-p3767-0003"),
        ),
        Module("7623", "Jetson Orin Nano 4GB (P3767-0004)", "T234", CHIPID_T234, ("p3768-0000-p3767-0004",)),
        # Older boards: shown so the technician knows what is plugged in; R36 cannot flash them.
        Module("7019", "Jetson AGX Xavier", "T194", None, ()),
        Module("7e19", "Jetson Xavier NX", "T194", None, ()),
        Module("7f21", "Jetson Nano", "T210", None, ()),
        Module("7c18", "Jetson TX2", "T186", None, ()),
    )
}


def module_for(vendor: str, product: str) -> Module | None:
    if vendor.lower() != NVIDIA_VENDOR:
        return None
    return MODULES.get(product.lower())


def modules_for_machine(machine: str) -> list[Module]:
    return [m for m in MODULES.values() if machine in m.machines]


# The sysfs name of a USB device (bus-port[.port...], at most 7 tiers: USB's own limit), what
# `initrd-flash --usb-instance` takes. It names a board's work dir and its flash record:
# checked before it becomes part of any path. Here, not in discovery, so reading flash
# records (alma gates, alma verify) does not import pyudev.
USB_INSTANCE_GRAMMAR = re.compile(r"[0-9]{1,3}-[0-9]{1,3}(?:\.[0-9]{1,3}){0,6}")


def is_usb_instance(value: object) -> bool:
    return isinstance(value, str) and USB_INSTANCE_GRAMMAR.fullmatch(value) is not None
