"""Does this bundle fit this board? Checked before anything touches the board."""

from __future__ import annotations

from alma.errors import UserError
from alma.flash.pids import MODULES, module_for, modules_for_machine


def check_fits(machine: str, chipid: str | None, vendor: str, product: str, usb_instance: str) -> None:
    """Raise UserError naming both the bundle and the board when they do not match."""
    module = module_for(vendor, product)
    if module is None:
        raise UserError(
            f"USB {usb_instance} ({vendor}:{product}) is not a Jetson in recovery mode",
            hint="alma boards  (put the board into recovery mode first)",
        )
    if not module.flashable:
        raise UserError(
            f"USB {usb_instance} is a {module.name} ({module.soc}); ALMA-OS (L4T R36) supports Orin only",
            hint="flash an Orin module (APX ids 0955:7023..7623)",
        )
    if chipid and module.chipid and chipid.lower() != module.chipid:
        raise UserError(
            f"bundle for {machine} is built for chip {chipid}, but USB {usb_instance} is a {module.name} "
            f"(chip {module.chipid})",
            hint="build or pick the bundle for this board's MACHINE",
        )
    if machine in module.machines:
        return
    fits = modules_for_machine(machine)
    if fits:
        wanted = " / ".join(m.name for m in fits)
        raise UserError(
            f"bundle for {machine} ({wanted}) does not fit USB {usb_instance}: that board is a {module.name} "
            f"(0955:{product})",
            hint=f"use a bundle for one of: {', '.join(module.machines)}",
        )
    known = sorted({m for mod in MODULES.values() for m in mod.machines})
    raise UserError(
        f"unknown MACHINE {machine!r} in the bundle: cannot tell whether it fits the {module.name} "
        f"at USB {usb_instance}",
        hint=f"known Orin machines: {', '.join(known)}",
    )
