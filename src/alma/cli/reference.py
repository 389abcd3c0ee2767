"""Generate docs/cli.md from the click app, so the reference cannot drift from the code.

Run ``python -m alma.cli.reference > docs/cli.md``; a test fails when the committed copy
differs from what this prints.
"""

from __future__ import annotations

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


def render() -> str:
    head = [
        "# `alma` command reference",
        "",
        "Generated from the click app by `python -m alma.cli.reference`; do not edit by hand.",
        "",
        "## Exit codes",
        "",
        "The same for every verb (defined in `alma.errors`, mapped in `alma.cli.main`):",
        "",
        EXIT_CODES_DOC,
    ]
    return "\n".join(head + _walk(cli, ["alma"], None)).rstrip() + "\n"


if __name__ == "__main__":
    click.echo(render(), nl=False)
