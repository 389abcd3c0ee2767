"""``alma update``: signed A/B updates over the fleet's pinned ssh (docs/ota.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from alma.cli.output import finite, is_tty
from alma.errors import UserError


@click.command(
    epilog="Exit codes: 0 every board committed (or already ran this version); 1 at least one board was "
    "rolled back, refused, failed before the switch or skipped (each one runs a good slot: see its "
    "record); 4 at least one board did not come back (LOST: state unknown, power-cycle it and run the "
    "same command again); 2 bad .swu, fleet file, node or option, or the records dir cannot be written "
    "(the boards settle by themselves); 70 internal error (traceback in "
    "the crash log); 130 interrupted (run the same command again to resume). FAILED and LOST boards are "
    "tried again by the same command (a cut push goes on where the board has it). "
    "--abort BOARD: 0 the board let go (an uncommitted new slot is switched back and rebooted), "
    "4 the board did not answer, 2 bad fleet file or node."
)
@click.argument("swu", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--abort",
    "abort_nodes",
    multiple=True,
    metavar="BOARD",
    help="Release BOARD whatever run holds it and undo its uncommitted update (repeatable; no SWU). "
    "For a board a dead run left locked before its lease (1 h) lapses.",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Fleet file (default: $ALMA_FLEET or ~/.config/alma/fleet.toml).",
)
@click.option(
    "--cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The fleet's OTA certificate: the SWU must be signed by it (default: [ota] signing_cert in alma.toml; "
    "without either the signature is checked on the boards only).",
)
@click.option("--node", "node_names", multiple=True, help="Update only this node (repeatable). Default: every board.")
@click.option(
    "--canary",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Boards in the first wave; the rest wait for its verdict.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Boards updated at once in each later wave.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Stop starting new waves once more boards than this have failed.",
)
@click.option(
    "--boot-timeout",
    type=click.FloatRange(min=1),
    callback=finite,
    default=300.0,
    show_default=True,
    help="Seconds a board may take to come back after the reboot.",
)
@click.option(
    "--health-timeout",
    type=click.FloatRange(min=0),
    callback=finite,
    default=120.0,
    show_default=True,
    help="Seconds a board may take, once back, to prove healthy; then it is rolled back.",
)
@click.option(
    "--poll",
    "poll_s",
    type=click.FloatRange(min=0.05),
    callback=finite,
    default=2.0,
    show_default=True,
    help="Seconds between two questions to a rebooting board.",
)
@click.option("--agent", default="alma-ota", show_default=True, help="The board-side program (as the shell finds it).")
@click.option(
    "--records",
    "records_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where per-board records live (default: ~/.local/state/alma/update).",
)
@click.option(
    "--allow-downgrade",
    is_flag=True,
    help="Install a SWU older than what a board runs (refused without this flag, on the desktop and by "
    "SWUpdate on the board). The bootloader capsule still never goes below its lowest supported version.",
)
@click.option("--dry-run", is_flag=True, help="Ask each board its slots and print the plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (or the plan) as JSON.")
def update(
    swu: Path | None,
    abort_nodes: tuple[str, ...],
    cert: Path | None,
    fleet_path: Path | None,
    node_names: tuple[str, ...],
    canary: int,
    batch: int,
    max_failures: int,
    boot_timeout: float,
    health_timeout: float,
    poll_s: float,
    agent: str,
    records_dir: Path | None,
    allow_downgrade: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Install the signed SWU on the inactive slot of each board, reboot it into that slot and
    commit it only when the board proves healthy; otherwise roll it back and say why.

    Boards go in waves (--canary first, then --batch at a time). Every phase is recorded per
    board; running the same command again after Ctrl-C or a crash resumes where each board
    stopped. A board refuses a SWU not signed with its baked-in certificate, built for another
    machine or older than what it runs (unless --allow-downgrade).
    """
    from alma.fleet.inventory import load_fleet
    from alma.fleet.ssh import require_ssh
    from alma.update import engine as E
    from alma.update import records as R
    from alma.update.swu import read_swu

    if abort_nodes:
        if swu is not None:
            raise UserError("--abort takes no SWU", hint="alma update --abort BOARD --fleet FILE")
        _abort(load_fleet(fleet_path), abort_nodes, agent, as_json)
        return
    if swu is None:
        raise UserError("no SWU given", hint="alma update FILE.swu --fleet FILE (or --abort BOARD)")
    cert = cert or _configured_cert()
    info = read_swu(swu, cert=cert)
    if not info.signed:
        raise UserError(f"{swu} is not signed (no sw-description.sig)", hint="sign it with the fleet's OTA key")
    if info.verified is False:
        raise UserError(
            f"{swu} is not signed by the fleet certificate {cert} (certificates carried in its signature do not count)",
            hint="sign it with the fleet's OTA key, or pass the right --cert",
        )
    fl = load_fleet(fleet_path)
    nodes = [fl.node(n) for n in node_names] if node_names else [n for n in fl.nodes if n.role == "board"]
    if not nodes:
        raise UserError(f"no board in {fl.path}", hint='name nodes with --node, or add boards (role = "board")')
    require_ssh()
    root = records_dir or R.default_dir()
    opts = E.Options(
        canary=canary,
        batch=batch,
        max_failures=max_failures,
        boot_timeout=boot_timeout,
        health_timeout=health_timeout,
        poll_s=poll_s,
        agent=agent,
        allow_downgrade=allow_downgrade,
    )
    ctx = E.Context(fleet=fl, swu=swu, info=info, opts=opts, root=root, run=E.run_id(info))
    if dry_run:
        rows = E.dry_run(ctx, nodes)
        if as_json:
            click.echo(json.dumps({"swu": info.to_dict(), "plan": rows}, indent=2, sort_keys=True))
        else:
            who = (f"signed by {', '.join(s['subject'] for s in info.signers)} (verified)" if info.verified
                   else "signature not checked on this desktop (no --cert): the boards check it")  # fmt: skip
            click.echo(f"{swu.name}: {info.machine} {info.version}, {who}")
            for r in rows:
                click.echo(
                    f"wave {r['wave']}  {r['node']:<16} {r.get('action'):<7} "
                    f"{r.get('current_slot', '?')} -> {r.get('target_slot', '?')}  running {r.get('running')}  "
                    f"capsule: {r.get('capsule', '-')}  {E.board_text(r.get('why', ''), 600)}".rstrip()
                )
        return
    if not as_json:
        waves = E.plan_waves(nodes, canary, batch)
        click.echo(
            f"updating {len(nodes)} board(s) to {info.version} in {len(waves)} wave(s); records: "
            f"{R.campaign_dir(root, info.sha256)}",
            err=True,
        )
        ctx.on_event = lambda node, what: click.echo(f"  {node}: {what}", err=True)
    with R.CampaignLock(R.campaign_dir(root, info.sha256)):
        report = E.run_update(ctx, nodes)
    if as_json:
        data: dict[str, Any] = {
            "run": report.run,
            "swu": info.to_dict(),
            "waves": report.waves,
            "boards": [r.to_dict() for r in report.records],
            "exit_code": report.exit_code,
        }
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        for r in report.records:
            took = sum(p.duration_s or 0 for p in r.phases)
            click.echo(f"{r.node:<16} {r.result:<12} {took:6.1f} s  {E.board_text(r.reason or '', 600)}")
        if is_tty():
            click.echo(f"exit {report.exit_code}")
    sys.exit(report.exit_code)


def _abort(fl: Any, names: tuple[str, ...], agent: str, as_json: bool) -> None:
    from alma.fleet.ssh import require_ssh, run_remote
    from alma.update import engine as E

    nodes = [fl.node(n) for n in names]
    require_ssh()
    rows = []
    for n in nodes:
        res = run_remote(n, f"{agent} abort", fl.ssh, timeout=120)
        doc: Any = None
        for ln in reversed(res.lines):
            if ln.startswith("{"):
                try:
                    doc = json.loads(ln)
                except ValueError:
                    doc = None
                break
        # the answer counts even when the connection then drops: the board reboots into its old slot
        ok = res.error is None and res.returncode == 0 and isinstance(doc, dict) and "error" not in doc
        why = (doc or {}).get("error") if isinstance(doc, dict) else None
        rebooting = False
        if ok and doc.get("reboot_needed"):
            # the reboot cuts this session: its dropping is the expected answer (as in alma update)
            again = run_remote(n, f"{agent} abort --reboot", fl.ssh, timeout=60)
            rebooting = again.error is not None or again.returncode == 0
        rows.append(
            {
                "node": n.name,
                "ok": ok,
                "released": E.board_text(doc.get("released")) if ok and doc.get("released") else None,
                "rebooting": rebooting,
                "why": None if ok else E.board_text(why or res.why()),
            }
        )
    if as_json:
        click.echo(json.dumps({"aborted": rows}, indent=2, sort_keys=True))
    else:
        for r in rows:
            if r["ok"]:
                held = f"released run {r['released']}" if r["released"] else "nothing held it"
                click.echo(f"{r['node']:<16} {held}{'; rebooting into its old slot' if r['rebooting'] else ''}")
            else:
                click.echo(f"{r['node']:<16} not aborted: {r['why']}")
    sys.exit(0 if all(r["ok"] for r in rows) else 4)


def _configured_cert() -> Path | None:
    """``[ota] signing_cert`` of the checkout this runs in, if any (and if the file exists)."""
    from alma.imagebuild.ota import configured_cert
    from alma.settings import config, repo_root

    try:
        root = repo_root()
        p = configured_cert(root, config(root))
    except UserError:
        return None
    return p if p is not None and p.is_file() else None
