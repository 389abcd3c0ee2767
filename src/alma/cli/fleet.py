"""``alma fleet health`` and ``alma fleet inspect``: argument parsing and printing only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from almaboard import text as T

from alma.cli.output import finite, is_tty
from alma.errors import AlmaError, Interrupted, UserError

FLEET_OPT = click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Fleet file (TOML). Default: $ALMA_FLEET or ~/.config/alma/fleet.toml.",
)
UNKNOWN_EXIT = 3  # Nagios UNKNOWN: the plugin could not judge



class PluginCommand(click.Command):
    """A monitoring plugin (plugin guidelines): a usage or configuration error, unknown
    options included, is UNKNOWN (3), never CRITICAL (2), with the error on stderr (and,
    with --nagios, one UNKNOWN status line on stdout where the monitoring system reads it)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_nagios = "--nagios" in args  # before parsing: click consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = UNKNOWN_EXIT  # type: ignore[misc]  # click reads it per instance
            if wants_nagios:
                click.echo(f"FLEET UNKNOWN - {T.nagios_text(exc.format_message())}")
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AlmaError as exc:
            if not isinstance(exc, Interrupted):
                exc.exit_code = UNKNOWN_EXIT
                if ctx.params.get("nagios"):
                    click.echo(f"FLEET UNKNOWN - {T.nagios_text(exc.message)}")
            raise


def _echo_json(data: Any) -> None:
    click.echo(T.dumps(data, indent=2, sort_keys=True))  # strict JSON, ASCII escapes only


@click.group()
def fleet() -> None:
    """Fleet-wide health and read-only inspection over SSH (see docs/fleet.md)."""


@fleet.command(
    cls=PluginCommand,
    epilog="Exit codes (Nagios): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, the worst node with "
    "ordering OK < UNKNOWN < WARNING < CRITICAL (unreachable, timed-out, over-limit, unparsable or "
    "stale nodes are UNKNOWN). A usage or configuration error (bad fleet file, unknown option, "
    "no ssh) is UNKNOWN too: exit 3 with the error on stderr and no table; 70 internal error; "
    "130 interrupted.",
)
@FLEET_OPT
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@click.option("--nagios", is_flag=True, help="Print one Nagios status line with perfdata.")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=None, callback=finite,
              help="Per-node timeout in seconds (connect, read and judge the report).")  # fmt: skip
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to save the snapshot for `alma panel`. Default: ~/.local/state/alma/fleet-health.json.",
)
@click.option(
    "--history",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="SQLite history this run is appended to (uptime and incidents on the status page). "
    "Default: fleet-history.sqlite beside the snapshot.",
)
@click.option("--no-save", is_flag=True, help="Save neither the snapshot nor the history.")
@click.option("--prometheus", "prom_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the run as Prometheus metrics (textfile-collector format, atomically) "
              "to FILE.")  # fmt: skip
def health(
    fleet_path: Path | None, as_json: bool, nagios: bool, timeout: float | None, snapshot: Path | None,
    history: Path | None, no_save: bool, prom_path: Path | None = None,
) -> None:  # fmt: skip
    """Run `alma-health --json` on every node in parallel and show node x check.

    Desktop nodes also get the lab rule `no-local-ai`: any GPU compute process or known
    model server running there is CRITICAL, with the process named.
    """
    from alma.fleet import health as H
    from alma.fleet import history as Hist
    from alma.fleet import table
    from alma.fleet.inventory import load_fleet

    if as_json and nagios:
        raise UserError("--json and --nagios are exclusive", hint="pick one output format")
    fl = load_fleet(fleet_path)
    progress = None
    if is_tty() and not (as_json or nagios):
        from rich.progress import Progress

        progress = Progress(transient=True)
    if progress is not None:
        with progress:
            n_calls = sum(3 if n.role == "desktop" else 1 for n in fl.nodes)
            task = progress.add_task(f"asking {len(fl.nodes)} nodes", total=n_calls)
            report = H.run_fleet_health(fl, timeout=timeout, on_done=lambda _n: progress.advance(task))
    else:
        report = H.run_fleet_health(fl, timeout=timeout)

    if not no_save:
        # The verdict stands whatever the disk does: a full or read-only state directory is a
        # warning, never a traceback (exit 1 would read as WARNING to a monitoring system).
        snap = snapshot or H.default_snapshot_path()
        try:
            H.save_snapshot(report, snap)
        except OSError as exc:
            click.echo(f"warning: snapshot not saved: {snap}: {exc.strerror or exc}", err=True)
        try:
            Hist.append(history or Hist.default_history_path(snap), report, max_gap=fl.panel.stale_after)
        except AlmaError as exc:
            click.echo(f"warning: history not updated: {exc.message}", err=True)
    if prom_path is not None:
        from alma.fleet.metrics import write_textfile

        try:
            write_textfile(prom_path, report)
        except OSError as exc:
            click.echo(f"warning: metrics not written: {prom_path}: {exc.strerror or exc}", err=True)
    if fl.alerts and not no_save:
        from alma.fleet import alerts as A

        snap_for_alerts = snapshot or H.default_snapshot_path()
        try:  # deliveries run detached: they never hold up the verdict or the exit code
            A.fire(fl, report, A.default_state_path(snap_for_alerts))
        except AlmaError as exc:
            click.echo(f"warning: alerts not evaluated: {exc.message}", err=True)
    if nagios:
        click.echo(H.nagios_line(report))
    elif as_json:
        _echo_json(report.to_dict())
    elif is_tty():
        from alma.cli.output import console

        con = console()
        con.print(table.rich_table(report))
        colour = table.COLOUR[report.status]
        con.print(f"fleet: [{colour}]{report.status.name}[/] (exit {report.exit_code})")
    else:
        click.echo(table.plain(report))
    sys.exit(report.exit_code)


@fleet.command(
    epilog="Exit codes: 0 snapshot taken (items that could not be read are listed as 'not checked'), "
    "3 at least one node could not be reached at all (the snapshot is still written), 2 bad fleet "
    "file, unknown node or option, 70 internal error, 130 interrupted."
)
@FLEET_OPT
@click.argument("nodes", nargs=-1, required=True)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write to FILE (atomically)."
)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of Markdown.")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=None, callback=finite,
              help="Per-command timeout in seconds.")  # fmt: skip
def inspect(
    fleet_path: Path | None, nodes: tuple[str, ...], out: Path | None, as_json: bool, timeout: float | None
) -> None:
    """Read-only capacity and topology snapshot of NODE... (a fixed allow-list of commands).

    Reads UTC time, `free -b`, GPU compute processes, earlyoom, swap, `ip -br -4 address`,
    `rdma link show` and the configured fabric ports' carrier and speed. Nothing is changed
    on the node. The output separates what was verified live from what was not checked.
    """
    from alma.fleet import inspect as I
    from alma.fleet.inventory import load_fleet
    from alma.ground import write_atomic

    fl = load_fleet(fleet_path)
    targets = [fl.node(n) for n in dict.fromkeys(nodes)]
    if is_tty() and out is None and not as_json:
        click.echo(
            f"inspecting {len(targets)} node(s), {len(I.ALLOWED_COMMANDS)} read-only commands each ...", err=True
        )
    started, results = I.collect(fl, targets, timeout=timeout)
    text = (
        T.dumps(I.to_json(started, results), indent=2, sort_keys=True) + "\n"
        if as_json
        else (I.to_markdown(started, results))
    )
    if out is not None:
        write_atomic(out, text)
        click.echo(f"wrote {out}", err=True)
    else:
        click.echo(text, nl=False)
    sys.exit(3 if any(not r.reachable for r in results) else 0)


# `alma fleet add` lives in its own module (it writes fleet.toml and pins host keys)
from alma.cli.fleet_add import add as _add  # noqa: E402

fleet.add_command(_add)
