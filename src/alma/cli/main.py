"""Entry point of ``alma``. Verbs load lazily so ``alma --help`` starts fast.

Every exception ends here and becomes one of the exit codes of :data:`EXIT_CODES_DOC`
(defined in ``alma.errors``): a verb never calls ``sys.exit`` with a code of its own making,
except through :func:`usage_exit`, which lets a verb whose callers expect another
convention (``alma fleet health``: Nagios, UNKNOWN = 3) declare its usage-error code.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from alma import __version__
from alma.cli.output import secho
from alma.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NEGATIVE, EXIT_OK, EXIT_USAGE, AlmaError, UserError

EXIT_CODES: list[tuple[int, str]] = [
    (EXIT_OK, "ok: the verb did what was asked and the verdict is positive (claims hold, lint clean, build done)"),
    (
        EXIT_NEGATIVE,
        "negative verdict: a gate document is stale, lint has findings, the build (kas/bitbake) or the flash "
        "failed; the tool's own exit code is printed, never passed on as alma's",
    ),
    (
        EXIT_USAGE,
        "usage or precondition error: bad option, unknown machine/fact/component, an input file that is "
        "unreadable, not UTF-8, malformed or hostile, a host that is not ready; each printed with its fix",
    ),
    (EXIT_INTERNAL, "internal error: a bug in alma; the traceback is kept in a log file whose path is printed"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); work was stopped cleanly"),
]
EXIT_CODES_DOC = (
    "| code | meaning |\n|---|---|\n"
    + "".join(f"| {code} | {meaning} |\n" for code, meaning in EXIT_CODES)
    + "\nA verb whose callers expect another convention declares it (alma.cli.main.usage_exit) and lists it in\n"
    "its help: `alma fleet health` (and the on-board `alma-health`) follow the Nagios plugin convention\n"
    "(0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN: a usage or configuration error is UNKNOWN, 3).\n"
)

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
    "shell": ("alma.cli.shell", "shell", "kas shell (or -c CMD) with the plan and checks of alma build."),
    "dump": ("alma.cli.dump", "dump", "Print the merged kas config alma build would use (--lock: its pins)."),
    "checkout": ("alma.cli.checkout", "checkout", "kas checkout: the build's repositories, without building."),
    "lock": ("alma.cli.lock", "lock", "kas lock [--update]: pin the build's repositories in kas/alma.lock.yml."),
    "gates": ("alma.cli.gates", "gates", "Check or re-render gate documents against the facts manifest."),
    "boards": ("alma.cli.boards", "boards", "List NVIDIA boards on USB (recovery mode, flashing, booted)."),
    "flash": ("alma.cli.flash", "flash", "Verify a bundle, flash it to boards in recovery mode, watch them boot."),
    "setup": ("alma.cli.setup", "setup", "Prepare this host (udev rules for plugdev flashing)."),
    "fleet": ("alma.cli.fleet", "fleet", "Fleet-wide health and read-only inspection over SSH."),
    "panel": ("alma.cli.panel", "panel", "Render (and serve) the honest public status panel."),
    "lab": ("alma.cli.lab", "lab", "Virtual boards: the image's userland under real systemd (needs root)."),
    "update": ("alma.cli.update", "update", "Signed A/B updates of boards over ssh, committed only when healthy."),
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
    epilog="Exit codes: 0 ok; 1 negative verdict (stale, findings, failed build); 2 usage or precondition "
    "error (with its fix); 70 internal error (traceback saved to a log file); 130 interrupted. "
    "A command's own codes are in its help (flash 3/4/5, boards --wait 124, fleet inspect 3, fleet health: "
    "Nagios).",
)
@click.version_option(__version__, prog_name="alma")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option(
    "--no-color",
    is_flag=True,
    help="No colour in any output (the same as exporting NO_COLOR=1, which alma also honours).",
)
def cli(verbose: int, no_color: bool) -> None:
    """ALMA-OS toolchain: build, verify, gate, flash and watch ALMA-OS on Jetson Orin."""
    if no_color:
        os.environ["NO_COLOR"] = "1"  # rich, click via alma.cli.output.secho, and the tools alma runs
    level = logging.WARNING - 10 * min(verbose, 2)
    # force: this invocation's stderr, not the one of an earlier call in the same process
    # (an in-process caller's first stream may be closed by now)
    logging.basicConfig(level=level, format="%(name)s: %(message)s", stream=sys.stderr, force=True)


C = TypeVar("C", bound=click.Command)


def usage_exit(code: int) -> Callable[[C], C]:
    """Declare that ``cmd`` exits ``code`` instead of 2 on usage and precondition errors.

    Applied on top of ``@click.command``: option parsing errors (click) and UserErrors the
    command raises both carry the code to :func:`main`, which exits with it.
    """

    def apply(cmd: C) -> C:
        make_context, invoke = cmd.make_context, cmd.invoke

        def _make_context(*args: Any, **kwargs: Any) -> click.Context:
            try:
                return make_context(*args, **kwargs)
            except click.UsageError as exc:
                exc.exit_code = code  # type: ignore[misc]  # click reads it from the instance
                raise

        def _invoke(ctx: click.Context) -> Any:
            try:
                return invoke(ctx)
            except click.UsageError as exc:
                exc.exit_code = code  # type: ignore[misc]  # click reads it from the instance
                raise
            except UserError as exc:
                exc.exit_code = code
                raise

        cmd.__dict__.update(make_context=_make_context, invoke=_invoke, usage_exit_code=code)
        return cmd

    return apply


def _report(exc: AlmaError) -> None:
    # Messages quote paths, bundle words and device text: through the one sanitizer (an ESC,
    # OSC or bidi override in a udev attribute must not reach the terminal raw), lines kept.
    from almaboard.text import terminal  # only on the error path: start-up stays light

    secho(f"error: {terminal(exc.message, keep_newline=True)}", fg="red", err=True)
    if exc.hint:
        click.echo(f"  try: {terminal(exc.hint, keep_newline=True)}", err=True)


def crash_dir() -> Path:
    """Where tracebacks of internal errors are kept: $XDG_STATE_HOME/alma/crash."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "alma" / "crash"


def _keep_traceback(exc: BaseException, argv: list[str] | None) -> str:
    """Write the traceback to a new private file; its path (never the traceback) goes to the user."""
    import tempfile  # only on the error path: start-up of every verb stays light
    import traceback

    from alma.ground import utc_iso, utc_stamp

    text = (
        f"alma {__version__} internal error at {utc_iso()}\n"
        f"argv: {['alma', *(argv if argv is not None else sys.argv[1:])]}\n\n"
        + "".join(traceback.format_exception(exc))
    )
    for where in (crash_dir(), Path(tempfile.gettempdir())):
        try:
            where.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, path = tempfile.mkstemp(prefix=f"alma-crash-{utc_stamp()}-", suffix=".log", dir=where)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            return path
        except OSError:
            continue
    return "(could not be saved: no writable state or temp directory)"


def _stopping() -> None:
    """Interrupted: a repeated Ctrl-C while we exit must not turn 130 into death by SIGINT."""
    import signal

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit)."""
    try:
        rv = cli.main(args=argv, prog_name="alma", standalone_mode=False)
        # In non-standalone mode click returns ctx.exit(code)'s code, or the command's value.
        return rv if isinstance(rv, int) else EXIT_OK
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        _stopping()
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if isinstance(exc, click.UsageError) else EXIT_USAGE)
    except AlmaError as exc:
        _report(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _stopping()
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # `alma ... | head`: not an error; silence the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_OK)
    except Exception as exc:  # a bug: keep the traceback, say where, exit 70
        path = _keep_traceback(exc, argv)
        secho(f"internal error (a bug in alma): {type(exc).__name__}: {exc}", fg="red", err=True)
        click.echo(f"  traceback saved to {path}; please report it with that file", err=True)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
