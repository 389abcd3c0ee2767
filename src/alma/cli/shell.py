"""``alma shell``: kas shell with the plan `alma build` would use (files, environment, config,
preflight). The logic lives in ``alma.imagebuild``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from alma.cli.build import ADMIN_KEY, BUILD_DIR, FEATURE, IMAGE, KAS_FILE, MACHINE, NO_ADMIN_ACCESS, OTA_KEY

EXIT_CODES = (
    "Exit codes: 0 the shell (or -c command) exited 0; 1 it exited non-zero (its own code is printed); "
    "2 bad option, invalid kas file or a preflight problem (each listed with its fix); 70 internal error."
)


@click.command("shell", epilog=EXIT_CODES)
@MACHINE
@IMAGE
@FEATURE
@KAS_FILE
@BUILD_DIR
@ADMIN_KEY
@NO_ADMIN_ACCESS
@OTA_KEY
@click.option("-c", "--command", "command", metavar="CMD", help="Run CMD in the shell instead of an interactive one.")
def shell(
    machine: str | None,
    image: str | None,
    features: tuple[str, ...],
    kas_files: tuple[str, ...],
    build_dir: Path | None,
    admin_keys: tuple[Path, ...],
    no_admin_access: bool,
    ota_cert: Path | None,
    command: str | None,
) -> None:
    """Open kas shell (or run `-c CMD` in it) with exactly the kas files, environment and
    generated config `alma build` would use, after the same checks: bitbake typed there reads
    the plan's config as alma build's does (BBPOSTCONF, i.e. bitbake -R, after local.conf).

    e.g. alma shell -c 'bitbake -e alma-image | grep ^DISTRO='
    """
    from alma.errors import ToolError
    from alma.imagebuild import engine
    from alma.imagebuild import preflight as pf
    from alma.imagebuild.plan import cli_request, make_plan
    from alma.imagebuild.project import Project
    from alma.settings import repo_root

    probes = pf.default_probes()
    req = cli_request(
        machine,
        image,
        features=features,
        kas_files=kas_files,
        build_dir=build_dir,
        admin_keys=admin_keys,
        no_admin_access=no_admin_access,
        ota_cert=ota_cert,
        shell=command or "",
    )
    plan = make_plan(req, Project(repo_root()), probes)
    engine.require_preflight(plan, probes)
    code = engine.shell(plan)
    if code != 0:
        raise ToolError(f"kas shell exited with code {code}", returncode=code, hint="see its output above")
    sys.stdout.flush()
