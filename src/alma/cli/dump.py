"""``alma dump``: the merged kas configuration `alma build` would hand kas (like ``kas dump``,
offline), or its lock (``--lock``)."""

from __future__ import annotations

from pathlib import Path

import click

from alma.cli.build import FEATURE, KAS_FILE

EXIT_CODES = "Exit codes: 0 printed; 2 bad option or invalid kas file (with its fix); 70 internal error."


@click.command("dump", epilog=EXIT_CODES)
@click.option(
    "--machine", "-m", default=None, help="MACHINE (kas/machines/<name>.yml). Default: jetson-orin-nano-devkit."
)
@FEATURE
@KAS_FILE
@click.option("--lock", is_flag=True, help="Print the lock instead: overrides.repos.<id>.commit, as kas lock writes.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of YAML.")
def dump(machine: str | None, features: tuple[str, ...], kas_files: tuple[str, ...], lock: bool, as_json: bool) -> None:
    """Print the configuration kas merges from the build's kas files (base, machine, features,
    --kas-file, their includes and lock files), computed offline with kas's own include
    handler and checked like alma build checks it. `kas dump` gives the same but needs the
    repositories (network); this needs nothing.
    """
    import yaml

    from alma.cli.output import emit_json
    from alma.imagebuild.project import DEFAULT_MACHINE, Project, load_kas
    from alma.settings import repo_root

    project = Project(repo_root())
    project.require_layout()
    files = project.kas_files(machine or DEFAULT_MACHINE, features) + project.extra_kas_files(kas_files)
    kas = load_kas(project, files)
    data = dict(kas.data)
    header = data.get("header")
    if isinstance(header, dict):  # the includes are merged in: kas dump drops them too
        data["header"] = {k: v for k, v in header.items() if k != "includes"}
    if lock:
        pins = {r.repo_id: {"commit": r.commit} for r in kas.repos(Path(project.root)) if r.url and r.commit}
        data = {"header": {"version": data.get("header", {}).get("version", 14)}, "overrides": {"repos": pins}}
    if as_json:
        emit_json(data)
    else:
        class _Dumper(yaml.SafeDumper):  # local_conf_header blocks read as kas files write them: "|"
            pass

        def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

        _Dumper.add_representer(str, _text)
        click.echo(yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False), nl=False)
