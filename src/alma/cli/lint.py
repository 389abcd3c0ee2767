"""``alma lint``: parse arguments, print. The checks live in ``alma.lint``."""

from __future__ import annotations

import sys

import click

EXIT_CODES = (
    "Exit codes: 0 no findings; 1 findings (each printed as path:line: message [check]); "
    "2 cannot lint (no kas/ or layers/, kas or oelint-adv not installed) or a file cannot be judged "
    "(not UTF-8, unreadable: [unreadable]; the other files' findings are still printed); 70 internal error."
)


@click.command("lint", epilog=EXIT_CODES)
@click.option("--json", "as_json", is_flag=True, help="Print findings as JSON.")
def lint(as_json: bool) -> None:
    """Check kas files with the loader `alma build` uses (kas's own schema and header version,
    duplicate keys, YAML alias bombs, missing includes and include cycles, a machine file
    that builds another machine), pinned 40-hex commits or lock entries, the layers with
    oelint-adv (--release scarthgap --mode all), and layer network configs. Any finding fails.
    """
    from alma.cli.output import emit_json
    from alma.lint.run import lint as run_lint
    from alma.settings import repo_root

    root = repo_root()

    def progress(step: str) -> None:  # stderr: stdout stays findings (or JSON) only
        click.echo(f"alma lint: {step} ...", err=True)

    report = run_lint(root, progress=progress)
    if as_json:
        emit_json(report.to_dict())
    else:
        for finding in sorted(report.findings):
            click.echo(finding.format(root))
        counts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in report.checked.items())
        verdict = f"{len(report.findings)} finding(s)" if report.findings else "clean"
        skipped = f"; skipped: {', '.join(report.skipped)}" if report.skipped else ""
        click.echo(f"alma lint: {verdict} ({counts}){skipped}", err=bool(report.findings))
    from alma.errors import EXIT_NEGATIVE, EXIT_USAGE
    from alma.imagebuild.kasfile import UNREADABLE

    if any(f.check == UNREADABLE for f in report.findings):
        sys.exit(EXIT_USAGE)  # a file could not be judged at all: not a verdict on it
    if report.findings:
        sys.exit(EXIT_NEGATIVE)  # findings: the documented exit code 1
