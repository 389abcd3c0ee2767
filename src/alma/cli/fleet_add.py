"""``alma fleet add``: put one node into the fleet file by hand (logic: alma.fleet.join)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(
    "add",
    epilog="Exit codes: 0 added; 2 invalid name, destination, role, alias or host key, a node of that "
    "name already in the fleet, or a fleet file the loader refuses (nothing is written then); "
    "70 internal error.",
)
@click.argument("name")
@click.option("--ssh", "dest", required=True, metavar="DEST", help="ssh destination, e.g. alma@192.0.2.7.")
@click.option("--alias", default=None, help="The only name the public panel shows.")
@click.option("--role", default="board", show_default=True, help="board | cluster | desktop.")
@click.option(
    "--host-key",
    default=None,
    metavar="KEY",
    help="Pin the host key: 'SHA256:...' (as the board prints on its console) or the full public key.",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Fleet file (TOML). Default: $ALMA_FLEET or ~/.config/alma/fleet.toml.",
)
def add(name: str, dest: str, alias: str | None, role: str, host_key: str | None, fleet_path: Path | None) -> None:
    """Add node NAME to the fleet file (written atomically, validated like the loader).

    With --host-key, `alma fleet health` reaches the node with strict host key checking
    against that key only (see docs/fleet.md, "Pinned host keys").
    """
    from alma.fleet.inventory import default_fleet_path
    from alma.fleet.join import add_to_fleet, make_entry

    entry = make_entry(name, dest, role=role, host_key=host_key, alias=alias)
    path = fleet_path or default_fleet_path()
    add_to_fleet(path, entry)
    click.echo(entry.toml(), nl=False)
    click.echo(f"added {name} to {path}", err=True)
