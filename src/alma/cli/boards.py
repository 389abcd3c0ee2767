"""``alma boards``: list NVIDIA boards on USB (recovery mode, flashing, booted)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from almaboard import text as T

from alma.cli.output import console, emit_json, finite, is_tty

if TYPE_CHECKING:
    from alma.flash.discovery import UsbBoard

EXIT_WAIT_TIMEOUT = 124  # like timeout(1): --wait saw no board in recovery mode in time


@click.command(
    epilog="Exit codes: 0 listed (with --wait: a board in recovery mode appeared), "
    f"{EXIT_WAIT_TIMEOUT} --wait timed out with no board in recovery mode, 2 usage error "
    "or libudev unavailable (or pyudev not installed), 70 internal error, 130 interrupted."
)
@click.option(
    "--wait", "wait", is_flag=True, help="Wait (event-driven, udev monitor) until a board in recovery mode appears."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    callback=finite,
    default=None,
    help="With --wait: give up after S seconds (default: wait forever).",
)
@click.option("--board", "usb_instance", metavar="USB_INSTANCE", help="With --wait: wait for this usb instance only.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def boards(wait: bool, timeout: float | None, usb_instance: str | None, as_json: bool) -> None:
    """List NVIDIA devices on USB: Jetsons in recovery mode (module, SoC, the
    --usb-instance value, port path, speed), the initrd-flash gadget of a flash in
    progress, and booted boards in USB device mode.

    An empty listing is not proof that no board is connected; the command says what to check.
    """
    from alma.flash import require_station_deps

    require_station_deps()
    from alma.flash import discovery

    if timeout is not None and not wait:
        raise click.UsageError("--timeout only makes sense with --wait")
    timed_out = False
    try:
        if wait:
            where = f" at {usb_instance}" if usb_instance else ""
            limit = f" (up to {timeout:g} s)" if timeout is not None else ""

            def listening() -> None:
                click.echo(f"waiting for a Jetson in recovery mode{where}{limit} ...", err=True)

            found = discovery.wait_for_boards(timeout, usb_instance=usb_instance, listening=listening)
            timed_out = not found
        found_all = discovery.list_boards()
    except OSError as exc:
        from alma.errors import UserError

        raise UserError(
            f"cannot read USB devices through libudev: {exc}", hint="run on the flashing host (needs /sys and libudev)"
        ) from exc

    if as_json:
        emit_json(
            {
                "boards": [b.to_dict() for b in found_all],
                "recovery": sum(b.in_recovery for b in found_all),
                "timed_out": timed_out,
            }
        )
    else:
        _print(found_all)
        if not any(b.in_recovery for b in found_all):
            click.echo("", err=True)
            click.echo(discovery.NO_BOARD_HELP, err=True)
    if timed_out:
        sys.exit(EXIT_WAIT_TIMEOUT)


def _print(found: list[UsbBoard]) -> None:
    if not found:
        return
    if is_tty():
        from rich.table import Table
        from rich.text import Text

        table = Table("USB instance", "state", "device", "SoC", "id", "speed", "path")
        for b in found:
            cells = (
                b.usb_instance,
                b.state,
                b.description,
                b.soc or "",
                f"{b.vendor}:{b.product}",
                b.speed or "",
                "via hub" if b.via_hub else "direct",
            )
            # udev attributes come from the device: sanitized, and never rich markup
            table.add_row(*(Text(T.terminal(c)) for c in cells))
        console().print(table)
        if any(b.via_hub and b.in_recovery for b in found):
            click.echo("note: a board behind a hub flashes less reliably; use a port on the host itself", err=True)
        return
    for b in found:
        hub = "via-hub" if b.via_hub else "direct"
        fields = [b.usb_instance, b.state, f"{b.vendor}:{b.product}", b.soc or "-", b.speed or "-", hub, b.description]
        click.echo("\t".join(T.terminal(f) for f in fields))
