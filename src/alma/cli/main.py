"""Entry point of ``alma``. Verbs load lazily so ``alma --help`` starts fast.

Exit codes (all commands): 0 success, 2 usage/config/precondition error (with a "try:"
hint), 130 interrupted (Ctrl-C), 1 internal error (a bug: traceback shown). A failed
external tool passes on its own code where meaningful. Commands document their own
additional codes (gates: 1 stale; fleet health: Nagios severities).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from alma import __version__
from alma.errors import AlmaError

# verb -> (module, attribute, one-line help). Help text lives here so `alma --help`
# does not import every verb's dependencies.
VERBS: dict[str, tuple[str, str, str]] = {
    "build": ("alma.cli.build", "build", "Build an ALMA-OS image with kas + bitbake, with progress and a summary."),
    "lint": (
        "alma.cli.lint",
        "lint",
        "Check kas files, pinned commits, the layer (oelint-adv) and network configs.",
    ),
    "verify": ("alma.cli.verify", "verify", "Read build artefacts on disk and write the facts manifest."),
    "gates": ("alma.cli.gates", "gates", "Check or re-render gate documents against the facts manifest."),
    "boards": ("alma.cli.boards", "boards", "List NVIDIA boards on USB (recovery mode, flashing, booted)."),
    "flash": ("alma.cli.flash", "flash", "Verify a bundle, flash it to boards in recovery mode, watch them boot."),
    "setup": ("alma.cli.setup", "setup", "Prepare this host (udev rules for plugdev flashing)."),
    "fleet": ("alma.cli.fleet", "fleet", "Fleet-wide health and read-only inspection over SSH."),
    "panel": ("alma.cli.panel", "panel", "Render (and serve) the honest public status panel."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(VERBS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = VERBS.get(cmd_name)
        if spec is None:
            return None
        module = importlib.import_module(spec[0])
        cmd = getattr(module, spec[1])
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, VERBS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Exit codes: 0 ok, 2 usage or precondition error, 130 interrupted, "
    "1 internal error; see each command's help for its own codes.",
)
@click.version_option(__version__, prog_name="alma")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """ALMA-OS toolchain: build, verify, gate, flash and watch ALMA-OS on Jetson Orin."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(name)s: %(message)s", stream=sys.stderr)


def _report(exc: AlmaError) -> None:
    click.secho(f"error: {exc.message}", fg="red", err=True)
    if exc.hint:
        click.echo(f"  try: {exc.hint}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit)."""
    try:
        rv = cli.main(args=argv, prog_name="alma", standalone_mode=False)
        # In non-standalone mode click returns ctx.exit(code)'s code, or the command's value.
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code == 2 else exc.exit_code)
    except AlmaError as exc:
        _report(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        # `alma ... | head`: not an error; silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    sys.exit(main())
