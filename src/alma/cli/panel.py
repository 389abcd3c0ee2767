"""``alma panel``: render (and optionally serve) the public status page. Parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import click

from alma.cli.output import finite


@click.command(
    epilog="Exit codes: 0 page written (or server stopped with Ctrl-C), 2 no snapshot / bad fleet "
    "file / unreadable history / unwritable --out / the page would leak an IP address or internal "
    "name (nothing written) / port in use, 70 internal error, 130 interrupted before the server "
    "started."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("panel"),
    show_default=True,
    help="Directory to write index.html, status.json and feed.atom into (each atomically).",
)
@click.option("--stale-after", type=click.FloatRange(min=1), default=None, callback=finite,
              help="Seconds; default from [panel].")  # fmt: skip
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Fleet file (aliases, [panel] title and figures). Default: $ALMA_FLEET or "
              "~/.config/alma/fleet.toml.")  # fmt: skip
@click.option("--snapshot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Health snapshot. Default: ~/.local/state/alma/fleet-health.json.")  # fmt: skip
@click.option("--history", "history_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Fleet history (uptime, state changes). Default: fleet-history.sqlite beside the snapshot; "
              "without one the page shows no uptime yet.")  # fmt: skip
@click.option("--erancloud-status", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also publish ERANCLOUD's figures (live / registered workers, dry runs, round, "
              "accuracy) from its coordinator's status.json.")  # fmt: skip
@click.option("--serve", is_flag=True, help="Serve the page over HTTP and re-render it on an interval.")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to serve on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True, help="Port (0: any free).")
@click.option("--interval", type=click.FloatRange(min=1), default=60.0, show_default=True, callback=finite,
              help="Seconds between re-renders while serving.")  # fmt: skip
def panel(
    out: Path, stale_after: float | None, fleet_path: Path | None, snapshot: Path | None, history_path: Path | None,
    serve: bool, bind: str, port: int, interval: float, erancloud_status: Path | None = None,
) -> None:  # fmt: skip
    """Render the sanitized status page from the last `alma fleet health` snapshot.

    Every node is green, red or grey under its public alias; the page shows the time of the
    data and turns on a staleness banner by itself (in the browser) once the data is older
    than --stale-after (or from the future: the clocks disagree), even when the page is
    served long after it was rendered. With the history that `alma fleet health` keeps it
    shows uptime over 24 h / 7 d / 30 d and the last state changes; status.json and
    feed.atom carry the same for scripts and feed readers. --serve answers GET and HEAD.
    """
    from alma.errors import UserError
    from alma.fleet import panel as P
    from alma.fleet.erancloud_figures import with_erancloud_figures
    from alma.fleet.health import default_snapshot_path
    from alma.fleet.inventory import load_fleet
    from alma.fleet.serve import serve as serve_panel

    snap_path = snapshot or default_snapshot_path()

    def render() -> Path:
        fl = load_fleet(fleet_path)
        if erancloud_status is not None:  # re-read on every render: the figures follow the file
            fl = with_erancloud_figures(fl, erancloud_status)
        return P.render_to(out, fl, snap_path, stale_after=stale_after, refresh_s=int(interval) if serve else None,
                           history_path=history_path)  # fmt: skip

    page = render()
    click.echo(f"wrote {page}", err=True)
    if not serve:
        return

    def on_error(exc: Exception) -> None:
        from almaboard import text

        click.echo(f"re-render failed, still serving the previous page: {text.terminal(exc)}", err=True)

    try:
        serve_panel(out, bind, port, interval, render, on_error,
                    ready=lambda url: click.echo(f"serving {url}", err=True))
    except OSError as exc:
        raise UserError(f"cannot serve on {bind}:{port}: {exc}", hint="pick another --port") from exc
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
