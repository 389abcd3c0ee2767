"""``alma lock``: kas lock with alma build's kas files, tree and checks. The logic lives in
``alma.imagebuild.repos``."""

from __future__ import annotations

from typing import Any

import click

from alma.cli.checkout import EXIT_CODES, repo_options, run_kas_verb


@click.command("lock", epilog=EXIT_CODES.format(done="the lock is written (or already up to date)"))
@repo_options("Print each repository's lock before and after as JSON.")
def lock(**opts: Any) -> None:
    """Pin every repository to a commit (kas lock): kas checks the repositories out and writes
    overrides.repos.<id>.commit into kas/alma.lock.yml (the lock of the chain's first file,
    kas/alma.yml) for each repository without one; locks already there are kept. --update:
    fetch each branch head and rewrite the locks that moved. Then each repository is listed
    with its lock before and after: review and commit the lock file. Offline with
    KAS_PREMIRRORS, as alma build.
    """
    run_kas_verb("lock", **opts)
