"""``alma lock``: kas lock with alma build's kas files, tree and checks. The logic lives in
``alma.imagebuild.repos``."""

from __future__ import annotations

from pathlib import Path

import click

EXIT_CODES = (
    "Exit codes: 0 the lock is written (or already up to date); 1 kas failed (its exit code and last words "
    "are printed); 2 bad option, invalid kas file, or a problem found before kas ran (not a checkout, no kas, "
    "a repository kas's git cannot reach: each with its fix); 70 internal error; 130 interrupted."
)


@click.command("lock", epilog=EXIT_CODES)
@click.option(
    "--machine",
    "-m",
    default=None,
    help="MACHINE (kas/machines/<name>.yml). Default: KAS_MACHINE, else jetson-orin-nano-devkit.",
)
@click.option("--feature", "features", multiple=True, metavar="NAME", help="Add kas/features/<NAME>.yml (repeatable).")
@click.option("--kas-file", "kas_files", multiple=True, metavar="FILE[:FILE]", help="More kas files (as alma build).")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="As alma build.")
@click.option(
    "--update",
    is_flag=True,
    help="kas lock --update: fetch each repository's branch head and move its lock there.",
)
@click.option("--json", "as_json", is_flag=True, help="Print each repository's lock before and after as JSON.")
def lock(
    machine: str | None,
    features: tuple[str, ...],
    kas_files: tuple[str, ...],
    build_dir: Path | None,
    update: bool,
    as_json: bool,
) -> None:
    """Pin every repository to a commit (kas lock): kas checks the repositories out and writes
    overrides.repos.<id>.commit into kas/alma.lock.yml (the lock of the chain's first file,
    kas/alma.yml) for each repository without one; locks already there are kept. With
    --update the branch heads are fetched and the locks that moved are rewritten. Then each
    repository is listed with its lock before and after: review and commit the lock file.
    Offline with KAS_PREMIRRORS, as alma build.
    """
    from alma.cli.checkout import _run

    _run("lock", machine, features, kas_files, build_dir, update, False, as_json)
