"""``alma gates check|render``: gate documents against the facts manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from alma.cli.output import emit_json, secho

_PATHS = click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
_FACTS = click.option(
    "--facts",
    "facts_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory of facts manifests and flash-records/ (default: <root>/facts).",
)
_ROOT = click.option(
    "--root", type=click.Path(path_type=Path, file_okay=False), help="Project root (default: this checkout)."
)


def _root(root: Path | None) -> Path:
    from alma import settings

    return (root or settings.repo_root()).resolve()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def gates() -> None:
    """Check gate documents (docs/gates/*.md) against the facts manifest, or re-render
    their claimed values from it. Format: docs/gates.md."""


@gates.command(
    epilog="Exit codes: 0 every claim holds; 1 stale: at least one claim is contradicted by the facts "
    "or asserts what the manifest cannot back; 2 cannot judge: missing manifest, malformed document, "
    "unknown claim, no documents (with --strict also: unmarked prose that makes a checkable claim); "
    "70 internal error."
)
@_PATHS
@click.option("--json", "as_json", is_flag=True, help="Machine-readable findings on stdout.")
@click.option("--strict", is_flag=True, help="Unmarked prose claims are errors, not warnings.")
@_FACTS
@_ROOT
def check(paths: tuple[Path, ...], as_json: bool, strict: bool, facts_dir: Path | None, root: Path | None) -> None:
    """Compare every claim in PATHS (files or dirs; default docs/gates/*.md) with the facts.

    For each stale claim: the document and line, the claim, the fact, where the fact came
    from, and the fix. Sizes hold within half a unit of the last stated digit ("1.6 GB"
    holds for 1.55-1.65 GB). Status labels are derived from facts/flash-records now.
    """
    from alma.gates.check import ERROR, WARNING
    from alma.gates.check import check as run
    from alma.gates.claims import HOLDS, STALE, UNBACKED, show

    report = run(list(paths), root=_root(root), facts_dir=facts_dir, strict=strict)
    code = report.exit_code
    if as_json:
        emit_json(
            {
                "exit_code": code,
                "docs": report.docs,
                "counts": {v: report.count(v) for v in (HOLDS, STALE, UNBACKED, WARNING, ERROR)},
                "findings": [f.to_dict() for f in report.findings if f.verdict != HOLDS],
                "holds": [f.to_dict() for f in report.findings if f.verdict == HOLDS],
            }
        )
        raise click.exceptions.Exit(code)
    for f in report.findings:
        if f.verdict == HOLDS:
            continue
        if f.verdict in (STALE, UNBACKED):
            secho(f"{f.doc}:{f.line}: {f.verdict}: {f.message}", fg="red", err=False)
            click.echo(f"    claim:  {f.claim}: {f.written}")
            click.echo(f"    fact:   {show(f.fact, f.claim)}")
            click.echo(f"    source: {f.source}")
            click.echo(f"    fix:    {f.fix}")
        elif f.verdict == WARNING or f.line:
            color = "yellow" if f.verdict == WARNING else "red"
            secho(f"{f.doc}:{f.line}: {f.verdict}: {f.message}", fg=color)
            click.echo(f"    fix:    {f.fix}")
        else:
            secho(f"error: {f.message}", fg="red")
            if f.fix:
                click.echo(f"  try: {f.fix}")
    verdict = {0: "all claims hold", 1: "STALE", 2: "cannot judge"}[code]
    click.echo(
        f"{report.docs} doc(s): {report.count(HOLDS)} hold, {report.count(STALE)} stale, "
        f"{report.count(UNBACKED)} unbacked, {report.count(WARNING)} warning(s), {report.count(ERROR)} error(s)"
        f": {verdict}",
        err=True,
    )
    raise click.exceptions.Exit(code)


@gates.command(
    epilog="Exit codes: 0 rendered (diff printed, or written with --write; also when nothing "
    "changes); 2 cannot render: missing manifest, malformed document, unknown claim (nothing written); "
    "70 internal error."
)
@_PATHS
@click.option("--write", is_flag=True, help="Rewrite the documents in place (atomically) instead of printing a diff.")
@_FACTS
@_ROOT
def render(paths: tuple[Path, ...], write: bool, facts_dir: Path | None, root: Path | None) -> None:
    """Re-render every claimed value that does not hold from the facts (jinja2), in place:
    front matter claims and <!-- fact:NAME -->value<!-- /fact --> markers. Prints a unified
    diff; --write writes it. Values that hold are left exactly as written."""
    import difflib

    from alma.gates.check import display
    from alma.gates.check import render as run
    from alma.ground import write_atomic

    results = run(list(paths), root=_root(root), facts_dir=facts_dir)  # raises before anything is written
    changed = [(p, old, new) for p, old, new in results if old != new]
    for path, old, new in changed:
        name = display(path)
        if write:
            mode = path.stat().st_mode & 0o777
            write_atomic(path, new)
            path.chmod(mode)
            click.echo(f"rewrote {name}", err=True)
        else:
            diff: Any = difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}"
            )
            click.echo("".join(diff), nl=False)
    if not changed:
        click.echo(f"{len(results)} doc(s) up to date", err=True)
    elif not write:
        click.echo(f"{len(changed)} doc(s) would change; apply with: alma gates render --write", err=True)
