"""``alma checkout``: kas checkout with alma build's kas files, tree and checks (and the
options ``alma lock`` shares). The logic lives in ``alma.imagebuild.repos``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from alma.cli.build import BUILD_DIR, FEATURE, KAS_FILE, MACHINE

EXIT_CODES = (
    "Exit codes: 0 {done}; 1 kas failed (its exit code and last words are printed); "
    "2 bad option, invalid kas file, or a problem found before kas ran (not a checkout, no kas, a repository "
    "kas's git cannot reach: each with its fix); 70 internal error; 130 interrupted."
)


def repo_options(json_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of the verbs that run kas on the build's chain without building."""

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(
            [
                MACHINE,
                FEATURE,
                KAS_FILE,
                BUILD_DIR,
                click.option("--update", is_flag=True, help="kas --update: fetch each repository's branch head "
                             "(the lock is ignored; alma lock rewrites the locks that moved)."),
                click.option("--json", "as_json", is_flag=True, help=json_help),
            ]
        ):  # fmt: skip
            f = opt(f)
        return f

    return apply


@click.command("checkout", epilog=EXIT_CODES.format(done="every repository checked out"))
@repo_options("Print each repository (path, HEAD, pin, state) as JSON.")
@click.option(
    "--force-checkout", is_flag=True, help="kas --force-checkout: discard local changes and check the pins out."
)
def checkout(**opts: Any) -> None:
    """Check out every repository of the build's kas files without building (kas checkout),
    where alma build will use them (KAS_WORK_DIR, default <checkout>/build), then list each
    with the commit it is at. --update: follow the branch heads (kas --update, ignores the
    lock). Offline with KAS_PREMIRRORS (or GITCONFIG_FILE insteadOf rules): each repository
    is first asked as kas's git will ask it.
    """
    run_kas_verb("checkout", **opts)


def run_kas_verb(
    verb: str,
    *,
    machine: str | None,
    features: tuple[str, ...],
    kas_files: tuple[str, ...],
    build_dir: Path | None,
    update: bool,
    as_json: bool,
    force_checkout: bool = False,
) -> None:
    from alma.cli.output import emit_json
    from alma.imagebuild import preflight as pf
    from alma.imagebuild import repos
    from alma.imagebuild.project import Project
    from alma.settings import repo_root

    probes = pf.default_probes()
    project = Project(repo_root())
    run = repos.plan(verb, project, machine=machine, features=features, kas_files=kas_files, build_dir=build_dir,
                     update=update, force_checkout=force_checkout, env=probes.env)  # fmt: skip
    repos.require(run, probes)
    for note in run.notes:  # dirty or moved checkouts: kas leaves a dirty one as it is
        click.echo(note, err=True)
    out = repos.execute(run, lambda line: click.echo(line, err=True), env=probes.env)
    if as_json:
        emit_json(out)
    else:
        for line in repos.summary_lines(out, project.root):
            click.echo(line)
