"""``alma lab``: virtual boards (the image's userland under real systemd) to rehearse fleet
and update flows on before touching hardware (docs/lab.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from alma.cli.output import finite, secho

if TYPE_CHECKING:
    from alma.lab.board import Board

EPILOG = (
    "Exit codes: 0 done; 2 not root, a tool missing, an unknown board or zone, a board that did not "
    "boot (each with its fix); 70 internal error; 130 interrupted."
)
SSH_EPILOG = (
    "Exit codes: 0 done; 1 ssh or the remote command ended with a non-zero code; 2 not root, a tool "
    "missing, an unknown board; 70 internal error; 130 interrupted."
)
_DIR_HELP = "The lab's directory (default: $ALMA_LAB_DIR or /run/alma-lab)."


def _lab_dir(value: Path | None) -> Path:
    from alma.lab.board import DEFAULT_DIR

    return value or Path(os.environ.get("ALMA_LAB_DIR") or DEFAULT_DIR)


def _dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--dir", "lab_dir", type=click.Path(file_okay=False, path_type=Path), help=_DIR_HELP)(f)


def _board(lab: Path, name: str) -> Board:
    from alma.errors import UserError
    from alma.lab.board import Board, boards

    if name not in {b.name for b in boards(lab)}:
        known = ", ".join(b.name for b in boards(lab)) or "none (alma lab up)"
        raise UserError(f"no board {name!r} in {lab}", hint=f"boards: {known}")
    return Board(lab, name)


@click.group(epilog=EPILOG)
def lab() -> None:
    """Virtual boards: ALMA-OS's userland as the image installs it, under real systemd.

    Each board is this host's own tree with the board's files over it (overlayfs on a
    tmpfs), booted with systemd-nspawn; reachable over ssh with the image's keys-only
    access on 127.0.0.1 at its own port. Needs root.
    """


_OTA_CERT_HELP = (
    "The OTA certificate the boards' image bakes in (default: the lab's own, DIR/ota-cert.pem with its "
    "key DIR/ota-key.pem, made at the first up)."
)


@lab.command(epilog=EPILOG)
@click.option("--boards", "count", type=click.IntRange(1, 16), default=1, show_default=True, help="How many.")
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a fleet file reaching the boards here (for alma fleet / alma update).",
)
@click.option("--prefix", default="vb", show_default=True, help="Board names: PREFIX1, PREFIX2, ...")
@click.option("--ota-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), help=_OTA_CERT_HELP)
@click.option(
    "--cpus",
    type=click.FloatRange(min=0.05),  # at most the host's cores: checked in the body (the help is host-free)
    callback=finite,
    default=None,
    help="Hold each board to this many of the host's cores (CFS bandwidth on its cgroup), as a real board "
    "has cores of its own: boards measured side by side then do not slow each other down through the "
    "host. Default: the host's cores, shared.",
)
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the boards as JSON.")
def up(
    count: int,
    fleet_path: Path | None,
    prefix: str,
    ota_cert: Path | None,
    cpus: float | None,
    lab_dir: Path | None,
    as_json: bool,
) -> None:
    """Start virtual boards and wait until each one is ready (systemd up, ssh answers)."""
    from alma.errors import UserError
    from alma.lab import board

    board.require_root()
    host_cpus = os.cpu_count() or 1
    if cpus is not None and cpus > host_cpus:
        raise UserError(f"--cpus {cpus:g}: this host has {host_cpus} cores", hint=f"--cpus {host_cpus / count:g}")
    lab_path = _lab_dir(lab_dir)
    if ota_cert is not None:
        board.use_ota_cert(lab_path, ota_cert)
    made = board.up(lab_path, count, prefix, progress=lambda m: secho(m, err=True), cpus=cpus)
    if fleet_path is not None:
        from alma.ground import write_atomic

        write_atomic(fleet_path, board.fleet_toml(lab_path))
    rows = [{"name": b.name, "ssh": f"127.0.0.1:{b.port}", "ready_s": round(s, 2)} for b, s in made]
    if as_json:
        click.echo(json.dumps({"lab": str(lab_path), "boards": rows, "fleet": str(fleet_path or "")}, indent=1))
        return
    for r in rows:
        click.echo(f"{r['name']}: ready in {r['ready_s']} s, ssh {r['ssh']}")
    if fleet_path is not None:
        click.echo(f"fleet file: {fleet_path} (alma fleet health --fleet {fleet_path})")


@lab.command(epilog=EPILOG)
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def status(lab_dir: Path | None, as_json: bool) -> None:
    """List the lab's boards: running or not, ssh port, boots, current slot."""
    from alma.lab import board, machine

    board.require_root()
    lab_path = _lab_dir(lab_dir)
    rows = []
    for b in board.boards(lab_path):
        try:
            st = machine.slots(b.slot_dir)
            rows.append(
                {
                    "name": b.name,
                    "running": b.init_pid() is not None,
                    "ssh": f"127.0.0.1:{b.port}",
                    "boots": st["boots"],
                    "slot": "ab"[st["rootfs"]["current"]],
                }
            )
        except (OSError, ValueError, KeyError):
            rows.append({"name": b.name, "running": False, "ssh": None, "boots": 0, "slot": None})
    if as_json:
        click.echo(json.dumps({"lab": str(lab_path), "boards": rows}, indent=1))
        return
    for r in rows:
        click.echo(
            f"{r['name']}: {'running' if r['running'] else 'off'}, ssh {r['ssh']}, boots {r['boots']}, slot {r['slot']}"
        )
    if not rows:
        click.echo(f"no boards in {lab_path}")


@lab.command(context_settings={"ignore_unknown_options": True}, epilog=SSH_EPILOG)
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_dir_option
def ssh(name: str, command: tuple[str, ...], lab_dir: Path | None) -> None:
    """Log in to board NAME as the admin over ssh (or run COMMAND there)."""
    from alma import runner
    from alma.errors import AlmaError
    from alma.lab import board

    board.require_root()
    b = _board(_lab_dir(lab_dir), name)
    rc = runner.run_attached(b.ssh_argv(list(command)))
    if rc:
        raise AlmaError(f"ssh to {name} ended with exit code {rc}")


@lab.command(epilog=EPILOG)
@click.argument("name")
@click.option(
    "--power-cut", is_flag=True, help="Cut the power (every process killed at once) instead of a clean reboot."
)
@_dir_option
def reboot(name: str, power_cut: bool, lab_dir: Path | None) -> None:
    """Reboot board NAME (into the slot its bootloader state picks) and wait until it is ready."""
    from alma.lab import board

    board.require_root()
    b = _board(_lab_dir(lab_dir), name)
    secho(f"{name}: {'power cut' if power_cut else 'rebooting'}...", err=True)
    secs = b.reboot(power_cut=power_cut)
    click.echo(f"{name}: ready in {secs:.1f} s")


@lab.command(epilog=EPILOG)
@click.argument("name")
@click.argument("zone")
@click.argument("celsius", type=click.FloatRange(-40, 150), callback=finite)
@_dir_option
def heat(name: str, zone: str, celsius: float, lab_dir: Path | None) -> None:
    """Set thermal ZONE of board NAME (tj, tj-thermal or thermal_zone8) to CELSIUS."""
    from alma.lab import board

    board.require_root()
    b = _board(_lab_dir(lab_dir), name)
    z = b.heat(zone, celsius)
    click.echo(f"{name}: {z.name} ({(z / 'type').read_text().strip()}) at {celsius:g} C")


@lab.command(epilog=EPILOG)
@_dir_option
def down(lab_dir: Path | None) -> None:
    """Power every board off and remove the lab: no mount, process or file is left."""
    from alma.lab import board

    board.require_root()
    gone = board.down(_lab_dir(lab_dir))
    click.echo(f"stopped {', '.join(gone)}" if gone else "no boards")
