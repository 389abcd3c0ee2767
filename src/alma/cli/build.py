"""``alma build``: parse arguments, print. The logic lives in ``alma.imagebuild``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from alma.imagebuild.plan import BuildPlan

EXIT_CODES = (
    "Exit codes: 0 build (or --check) succeeded, or --dry-run found nothing a run would stop on; 1 the "
    "build or check failed: kas or bitbake failed (their "
    "own exit code is printed, with the failed tasks and their logs or kas's last words), or --check found "
    "an ALMA component missing from the image's graph; 2 bad option, unknown machine/image, invalid kas "
    "file, a release image without an admin key (or a malformed/private --admin-key file), "
    "or a preflight problem (each listed with the command that fixes it; --dry-run prints the plan, then "
    "exits 2 on the plan's own problems; the host's are shown); 70 internal error; "
    "130 interrupted with Ctrl-C (bitbake stopped cleanly)."
)


# The options of the verbs that plan a build (build, shell; checkout/lock and dump take the
# chain's): declared once so that each verb reads them, and documents them, as alma build does.
MACHINE = click.option(
    "--machine",
    "-m",
    default=None,
    help="MACHINE to build for (kas/machines/<name>.yml). Default: KAS_MACHINE when exported, "
    "else jetson-orin-nano-devkit.",
)
IMAGE = click.option("--image", "-i", default=None, help="Image recipe to build. Default: alma-image.")
FEATURE = click.option(
    "--feature",
    "features",
    multiple=True,
    metavar="NAME",
    help="Add kas/features/<NAME>.yml (repeatable), e.g. release, development, shared-sstate.",
)
BUILD_DIR = click.option(
    "--build-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where repositories, downloads, sstate and builds go. Default: <checkout>/build.",
)
ADMIN_KEY = click.option(
    "--admin-key",
    "admin_keys",
    multiple=True,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Public key (.pub) for the image's admin user alma (repeatable; keys only, no password). "
    "Default: [image] admin_keys in alma.toml, else ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub.",
)
NO_ADMIN_ACCESS = click.option(
    "--no-admin-access",
    is_flag=True,
    help="Build a sealed appliance: no admin user, no login (a release image otherwise needs a key).",
)
OTA_KEY = click.option(
    "--ota-key",
    "ota_cert",
    metavar="CERT",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Feature ota: the PEM certificate whose signature the boards require on every .swu "
    "(default: [ota] signing_cert in alma.toml; a release with ota needs one).",
)
KAS_FILE = click.option(
    "--kas-file",
    "kas_files",
    multiple=True,
    metavar="FILE[:FILE]",
    help="More kas files after the features, kas's colon list (repeatable), checked like every kas file; "
    "inside the checkout (kas merges files of one repository).",
)


@click.command("build", epilog=EXIT_CODES)
@MACHINE
@IMAGE
@FEATURE
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate and generate everything offline, print the exact commands and config, run nothing.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Check out, parse and compute the task graph (bitbake -p, -g) offline (BB_NO_NETWORK) "
    "without compiling, and report the image's recipes, tasks, ALMA components and kernel: "
    "what CI with cached repositories runs.",
)
@click.option(
    "--sstate-mirror",
    metavar="URL",
    help="Shared sstate cache (http(s)://, file:// or a directory): sets SSTATE_MIRRORS.",
)
@click.option(
    "--hashserv",
    metavar="ADDR",
    help="Shared read-only hash-equivalence server (host:port, unix://, "
    "wss://): OEEquivHash with BB_HASHSERVE=auto and this as BB_HASHSERVE_UPSTREAM.",
)
@click.option(
    "--jobs",
    "-j",
    type=int,
    default=None,
    help="Parallel bitbake tasks (BB_NUMBER_THREADS). Default: one per CPU, capped by RAM. "
    "PARALLEL_MAKE is chosen so that tasks x make jobs fit the RAM at 2 GiB each.",
)
@BUILD_DIR
@ADMIN_KEY
@NO_ADMIN_ACCESS
@OTA_KEY
@KAS_FILE
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="RECIPE",
    help="Build this recipe instead of the image (bitbake's target; repeatable; virtual/kernel too). "
    "Default: KAS_TARGET when exported, else --image, else the kas files' target.",
)
@click.option(
    "--task",
    metavar="TASK",
    help="Run this task only (bitbake -c TASK), e.g. fetch, compile, cleansstate. "
    "Default: KAS_TASK when exported, else the kas files' task (build).",
)
@click.option("-k", "--keep-going", is_flag=True, help="Continue as much as possible after an error (bitbake -k).")
@click.option(
    "--update",
    is_flag=True,
    help="kas --update: pull the repositories' branch heads (ignores the lock; to try the next lock update).",
)
@click.option(
    "--force-checkout",
    is_flag=True,
    help="kas --force-checkout: discard local changes in the repositories and check the pins out "
    "(the plan lists dirty and moved repositories).",
)
@click.argument("bitbake_args", nargs=-1, metavar="[-- BITBAKE_ARGS...]")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (--dry-run) or the summary as JSON.")
def build(
    machine: str | None,
    image: str | None,
    features: tuple[str, ...],
    dry_run: bool,
    check: bool,
    sstate_mirror: str | None,
    hashserv: str | None,
    jobs: int | None,
    build_dir: Path | None,
    admin_keys: tuple[Path, ...],
    no_admin_access: bool,
    ota_cert: Path | None,
    kas_files: tuple[str, ...],
    targets: tuple[str, ...],
    task: str | None,
    keep_going: bool,
    update: bool,
    force_checkout: bool,
    bitbake_args: tuple[str, ...],
    as_json: bool,
) -> None:
    """Build an ALMA-OS image with kas + bitbake: preflight, live progress, a summary.

    Arguments after `--` go to bitbake verbatim (each quoted), after the target:
    `alma build --target busybox -- -DD` runs `bitbake -R <config> busybox -DD` in kas shell.

    Every offline step runs first (kas files validated with kas's schema, config generated);
    then the host is checked (tools, disk, RAM, user, network) and every problem is listed
    at once before anything slow starts.
    """
    from alma.cli.output import emit_json, is_tty
    from alma.errors import Interrupted, ToolError
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
        check=check,
        sstate_mirror=sstate_mirror,
        hashserv=hashserv,
        jobs=jobs,
        build_dir=build_dir,
        admin_keys=admin_keys,
        no_admin_access=no_admin_access,
        ota_cert=ota_cert,
        targets=targets,
        task=task,
        keep_going=keep_going,
        bitbake_args=bitbake_args,
        kas_files=kas_files,
        update=update,
        force_checkout=force_checkout,
    )
    if check and (targets or task or keep_going or bitbake_args):
        from alma.errors import UserError

        raise UserError("--check parses and computes the graph only", hint="drop --target/--task/-k/-- with --check")
    plan = make_plan(req, Project(repo_root()), probes)

    if dry_run:
        problems = engine.preflight_problems(plan, probes, network=False)
        if as_json:
            emit_json({**plan.to_dict(), "preflight_offline": [{"problem": w, "fix": f} for w, f in problems]})
        else:
            _print_dry_run(plan, problems)
        if plan.problems:  # the plan refuses itself (no admin key, not a checkout...): so does the exit code
            from alma.errors import PreflightError

            raise PreflightError(plan.problems)
        return

    engine.require_preflight(plan, probes)
    for note in plan.notes:  # e.g. an OTA certificate close to its expiry
        if note.startswith("warning:"):
            click.echo(note, err=True)
    from alma.imagebuild.display import PlainDisplay, RichDisplay

    display: engine.Display = (
        RichDisplay() if is_tty() and not as_json else PlainDisplay(stream=sys.stderr if as_json else sys.stdout)
    )
    out = engine.execute(plan, display)
    if as_json:
        emit_json(out.to_dict())
    else:
        for line in engine.summary_lines(out):
            click.echo(line)
    if out.status == "interrupted":
        raise Interrupted(
            f"{plan.mode} interrupted; bitbake stopped cleanly",
            hint=f"run the same command again to continue where it stopped (log: {out.log_path})",
        )
    if out.status == "failed":
        why = out.reason or f"{out.failed_in} exited with code {out.returncode}"
        raise ToolError(
            f"{plan.mode} failed: {why}", returncode=out.returncode, log_path=str(out.log_path), hint=out.hint()
        )


def _print_dry_run(plan: BuildPlan, problems: list[tuple[str, str]]) -> None:
    from alma.runner import format_command

    req = plan.request
    click.echo(f"alma build --dry-run: {plan.mode} {req.image} for {req.machine} (nothing is run)")
    click.echo("kas files: " + " ".join(str(f.relative_to(plan.root)) for f in plan.kas_files))
    if plan.kas_view is not None:
        kv = plan.kas_view
        click.echo("kas will build (as kas resolves its files and KAS_* variables):")
        for name, v in (("MACHINE", kv.machine), ("DISTRO", kv.distro), ("task", kv.task)):
            click.echo(f"  {name} {v.value}  ({v.source})")
        click.echo(f"  targets {' '.join(kv.targets.value)}  ({kv.targets.source})")
    for note in plan.notes:
        click.echo(note)
    click.echo("environment (added for kas; an exported value wins over the default):")
    for k, v in plan.env.items():
        click.echo(f"  {k}={v}  ({plan.env_source(k)})")
    click.echo(f"config {plan.conf_path} (written at run time, read by bitbake -R):")
    for line in plan.conf_text.splitlines():
        click.echo(f"  | {line}")
    click.echo("commands:")
    from alma.imagebuild.preflight import premirror_url

    mirrors = os.environ.get("KAS_PREMIRRORS", "")  # the URL kas's git asks (kas's effective_url)
    for repo in plan.kas.repos(plan.work_dir):
        if repo.url and not repo.checked_out:
            url = premirror_url(repo.url, mirrors)
            click.echo(f"  {format_command(['git', 'ls-remote', '--quiet', url, 'HEAD'], plan.root)}")
    click.echo(f"  {format_command(plan.argv, plan.root)}")
    if problems:
        click.echo(f"preflight (offline part): {len(problems)} problem(s) a real run would stop on:")
        for what, fix in problems:
            click.echo(f"  {what}\n      fix: {fix}")
    else:
        click.echo("preflight (offline part): ok")
