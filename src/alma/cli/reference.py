"""Generate docs/cli.md from the click app, so the reference cannot drift from the code.

Run ``python -m alma.cli.reference > docs/cli.md``; a test fails when the committed copy
differs from what this prints.
"""

from __future__ import annotations

import re

import click

from alma.cli.main import EXIT_CODES_DOC, cli


def _walk(cmd: click.Command, path: list[str], ctx_parent: click.Context | None) -> list[str]:
    # make_context applies the command's context_settings (e.g. -h as a help alias)
    ctx = cmd.make_context(
        path[-1], [], parent=ctx_parent, resilient_parsing=True, max_content_width=100, terminal_width=100
    )
    out = [f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`", "", "```", cmd.get_help(ctx).rstrip(), "```", ""]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += _walk(sub, [*path, name], ctx)
    return out


# A code in a command's "Exit codes: 0 ...; 1 ...; 130 ..." epilog: the number at the start,
# or after a ';' or ',' (followed by its meaning, so "the order 130, 3, 4" is not a code).
_EXIT_CODE = re.compile(r"(?:^|[;,]|Exit codes(?: \([^)]*\))?:)\s+(\d{1,3})\s")


def exit_codes(cmd: click.Command) -> list[int]:
    """The exit codes ``cmd``'s help documents, in the order it lists them."""
    epilog = cmd.epilog or ""
    start = epilog.find("Exit codes")
    if start < 0:
        return []
    codes = [int(m.group(1)) for m in _EXIT_CODE.finditer(epilog[start:])]
    return list(dict.fromkeys(codes))


def commands(cmd: click.Command = cli, path: tuple[str, ...] = ("alma",)) -> list[tuple[str, click.Command]]:
    """Every leaf command as (``alma verb [sub]``, command), in the reference's order."""
    if not isinstance(cmd, click.Group):
        return [(" ".join(path), cmd)]
    ctx = click.Context(cmd, info_name=path[-1])
    out: list[tuple[str, click.Command]] = []
    for name in cmd.list_commands(ctx):
        sub = cmd.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            out += commands(sub, (*path, name))
    return out


def exit_code_table() -> str:
    rows = ["| command | exit codes (meaning: its help below) |", "|---|---|"]
    for name, cmd in commands():
        rows.append(f"| `{name}` | {', '.join(str(c) for c in exit_codes(cmd)) or '(not documented)'} |")
    return "\n".join(rows) + "\n"


def render() -> str:
    head = [
        "# `alma` command reference",
        "",
        "Generated from the click app by `python -m alma.cli.reference`; do not edit by hand.",
        "",
        "## Exit codes",
        "",
        "What each code means by default (defined in `alma.errors`, mapped in `alma.cli.main`):",
        "",
        EXIT_CODES_DOC,
        "Each command's own codes, from its help (a test checks them against the code that exits):",
        "",
        exit_code_table(),
    ]
    return "\n".join(head + _walk(cli, ["alma"], None)).rstrip() + "\n"


if __name__ == "__main__":
    click.echo(render(), nl=False)
