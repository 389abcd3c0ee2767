"""``alma setup``: prepare this host (udev rules for plugdev flashing)."""

from __future__ import annotations

import shlex
from pathlib import Path

import click


@click.group()
def setup() -> None:
    """Prepare this host for flashing."""


@setup.command(
    epilog="Exit codes: 0 written (or printed); 1 udevadm failed (its own exit code is printed, never "
    "passed on); 2 cannot write the rules (not root: use sudo); 70 internal error."
)
@click.option("--print", "print_only", is_flag=True, help="Print the rules instead of installing them.")
@click.option(
    "--rules-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write the rules (default /etc/udev/rules.d).",
)
@click.option("--group", default="plugdev", show_default=True, help="Group that may flash.")
@click.option("--reload/--no-reload", default=False, help="Also run udevadm control --reload and udevadm trigger.")
def udev(print_only: bool, rules_dir: Path | None, group: str, reload: bool) -> None:
    """Install udev rules so members of plugdev can flash Jetsons (recovery-mode APX ids
    0955:7xxx and initrd-flash's 1d6b:0104 gadget) without running alma as root."""
    from alma.flash import udev_rules

    if print_only:
        click.echo(udev_rules.render(group), nl=False)
        return
    path = udev_rules.install(rules_dir, group)
    click.echo(f"wrote {path}")
    if reload:
        udev_rules.reload_udev()
        click.echo("udev rules reloaded and USB devices re-triggered")
    else:
        click.echo("activate them: sudo udevadm control --reload && sudo udevadm trigger")
    click.echo(
        f"and add the technician to the group: sudo usermod -aG {shlex.quote(group)} \"$USER\" (then log in again)"
    )
