"""``alma flash``: verify a bundle, flash boards in recovery mode, watch them boot."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from almaboard import text as T

from alma.cli.output import console, emit_json, finite, is_tty, secho

if TYPE_CHECKING:
    from collections.abc import Callable

    from alma.flash.discovery import UsbBoard
    from alma.flash.session import BoardRun, BundleChoice, FlashSession

EPILOG = (
    "Exit codes: 0 every board flashed (and, when a console was watched, seen booting); "
    "2 refused before touching a board (no board, bundle/board mismatch, sha256 mismatch, "
    "unsafe or truncated archive, board locked by another flash, usage); 3 a flash failed "
    "(initrd-flash error or 'Final status: FAILED'); 4 a phase timed out (initrd-flash was "
    "stopped); 5 flashed but no boot seen on the console; 6 a board was flashed (or attempted) but its "
    "flash record could not be written (disk full: the record is printed on stderr, the logs stay in the "
    "work dir, whose path is printed); 130 interrupted (Ctrl-C or SIGTERM: "
    "every initrd-flash is stopped, every board gets an INTERRUPTED record; a second signal "
    "only stops them faster); 70 internal error. With --all the worst outcome decides, in the order 130, 3, 4, 6, "
    "2, 5, 0. Every attempt writes a flash record to facts/flash-records/, with the host log, "
    "device logs and transcript next to it."
)


def _phase_timeouts(values: tuple[str, ...]) -> dict[str, float]:
    from alma.flash.flasher import DEFAULT_TIMEOUTS

    out: dict[str, float] = {}
    for v in values:
        name, sep, secs = v.partition("=")
        if not sep or name not in DEFAULT_TIMEOUTS:
            raise click.BadParameter(
                f"{v!r}: want PHASE=SECONDS with PHASE one of {', '.join(DEFAULT_TIMEOUTS)}",
                param_hint="--phase-timeout",
            )
        try:
            seconds = float(secs)
        except ValueError:
            seconds = math.nan
        # nan/inf/<=0 would mean "no deadline" or "already expired": NVIDIA's script has no
        # timeouts of its own, so every phase must keep a real one.
        if not math.isfinite(seconds) or seconds <= 0:
            raise click.BadParameter(
                f"{v!r}: {secs!r} is not a positive number of seconds", param_hint="--phase-timeout"
            )
        out[name] = seconds
    return out


@click.command(epilog=EPILOG)
@click.argument("bundle", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--board", "board", metavar="USB_INSTANCE", help="The board to flash (see alma boards), e.g. 1-8.4.")
@click.option("--all", "all_boards", is_flag=True, help="Flash every board in recovery mode, concurrently.")
@click.option("--machine", help="MACHINE whose facts manifest names the bundle and its sha256.")
@click.option("--image", help="Image name of the facts manifest (when several fit).")
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Facts manifest to take the bundle and its sha256 from.",
)
@click.option("--sha256", "sha256", metavar="HEX", help="Expected sha256 when no facts manifest is at hand.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before erasing the boards.")
@click.option(
    "--console",
    "console_port",
    default="auto",
    show_default=True,
    metavar="PORT|auto|none",
    help="Serial console to watch for the boot (auto: the board's USB serial UART if one is found).",
)
@click.option(
    "--boot-timeout", type=click.FloatRange(min=0), callback=finite, default=300.0, show_default=True, help="Seconds."
)
@click.option(
    "--phase-timeout",
    multiple=True,
    metavar="PHASE=SECONDS",
    help="Override a phase's limit (phases and defaults: docs/flash.md#phases; e.g. storage=300).",
)
@click.option("--erase-nvme", is_flag=True, help="initrd-flash --erase-nvme (AGX Orin whose NVMe was flashed before).")
@click.option("--skip-bootloader", is_flag=True, help="initrd-flash --skip-bootloader (rootfs only).")
@click.option(
    "--pkc-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="PKC signing key file (initrd-flash -u); ignored with a warning for pre-signed bundles.",
)
@click.option(
    "--sbk-key",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SBK encryption key file (initrd-flash -v); ignored with a warning for pre-signed bundles.",
)
@click.option(
    "--unpack-cap",
    type=click.FloatRange(min=0, min_open=True),
    callback=finite,
    metavar="GB",
    help="Refuse bundles whose unpacked data exceeds GB (default: free space less 1 GB decides).",
)
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), help="Where bundles are unpacked.")
@click.option("--records-dir", type=click.Path(file_okay=False, path_type=Path), help="Where flash records go.")
@click.option("--keep-work", is_flag=True, help="Keep the unpacked bundle and per-board copies.")
@click.option("--hostname", metavar="NAME", help="Name the board (RFC 1123), written into its rootfs at flash time.")
@click.option(
    "--hostname-pattern",
    metavar="PATTERN",
    help="With --all: name the boards by number in USB order, e.g. 'edge-{n:02d}' -> edge-01, edge-02, ...",
)
@click.option(
    "--hostnames",
    "hostnames_csv",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="CSV",
    help="A CSV of USB_INSTANCE,HOSTNAME rows naming each board.",
)
@click.option(
    "--admin-key",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="An extra public key for the admin user alma on these boards (with a name option).",
)
@click.option(
    "--add-to-fleet",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FLEET_FILE",
    help="Append each board seen booting to this fleet file ([[node]] with its pinned host key).",
)
@click.option(
    "--ssh-user",
    default="alma",
    show_default=True,
    help="The admin user the fleet entry logs in as (the image's ALMA_ADMIN_USER).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary on stdout.")
def flash(
    bundle: Path | None,
    board: str | None,
    all_boards: bool,
    machine: str | None,
    image: str | None,
    manifest: Path | None,
    sha256: str | None,
    yes: bool,
    console_port: str,
    boot_timeout: float,
    phase_timeout: tuple[str, ...],
    erase_nvme: bool,
    skip_bootloader: bool,
    pkc_key: Path | None,
    sbk_key: Path | None,
    unpack_cap: float | None,
    work_dir: Path | None,
    records_dir: Path | None,
    keep_work: bool,
    hostname: str | None,
    hostname_pattern: str | None,
    hostnames_csv: Path | None,
    admin_key: Path | None,
    add_to_fleet: Path | None,
    ssh_user: str,
    as_json: bool,
) -> None:
    """Flash BUNDLE (default: the one the facts manifest names) to Jetsons in recovery mode.

    The bundle's sha256 is checked against the facts manifest while it is unpacked (one
    pass), its MACHINE against each board's USB id, then the bundle's own initrd-flash
    runs per board with per-phase time limits. Success needs exit 0 and 'Final status:
    SUCCESS'; with a console the record also says whether the board booted.
    """
    from alma.flash import require_station_deps

    require_station_deps()
    from alma.errors import UserError
    from alma.flash.flasher import FlashArgs
    from alma.flash.identity import IdentityPlan
    from alma.flash.interrupt import Interruption
    from alma.flash.session import FlashOptions, FlashSession

    if board and all_boards:
        raise click.UsageError("--board and --all exclude each other")
    opts = FlashOptions(
        bundle=bundle,
        machine=machine,
        image=image,
        manifest=manifest,
        sha256=sha256.lower() if sha256 else None,
        board=board,
        all_boards=all_boards,
        console=None if console_port == "none" else console_port,
        boot_timeout=boot_timeout,
        work_dir=work_dir,
        records_dir=records_dir,
        timeouts=_phase_timeouts(phase_timeout),
        keep_work=keep_work,
        identity=IdentityPlan.from_options(hostname, hostname_pattern, hostnames_csv, admin_key),
        flash_args=FlashArgs(erase_nvme, skip_bootloader, pkc_key, sbk_key),
        unpack_cap=int(unpack_cap * 1e9) if unpack_cap else None,
    )
    display = _Display(json_mode=as_json)
    stop = Interruption()
    session = FlashSession(
        opts, on_event=display.event, confirm=_confirmation(yes, stop), cancel=stop.cancel, urgent=stop.urgent
    )
    try:
        runs = session.run()
    except UserError:
        if not stop.interrupted:
            raise
        runs = []
    finally:
        stop.restore()
        display.close()
    _report(runs, session, stop.interrupted, as_json, add_to_fleet, ssh_user)


def _confirmation(yes: bool, stop: Any) -> Callable[[list[UsbBoard], BundleChoice], bool]:
    """Asks before erasing (unless --yes); once confirmed, a signal only sets the session's flag."""
    from alma.errors import UserError

    def confirmed(boards: list[UsbBoard], choice: BundleChoice) -> bool:
        if not yes:
            if not sys.stdin.isatty():
                raise UserError("flashing erases the boards and stdin is not a terminal", hint="add --yes to confirm")
            names = ", ".join(f"{b.usb_instance} ({b.module})" for b in boards)
            click.echo(f"bundle: {choice.path}\n  sha256 {choice.expected_sha256}\nboards: {names}", err=True)
            # Ctrl-C at the prompt aborts it (exit 130): nothing was touched yet
            if not click.confirm(f"Erase and flash {len(boards)} board(s)?", default=False, err=True):
                return False
        stop.install()  # from here on a signal only sets a flag the session acts on
        return True

    return confirmed


def _report(
    runs: list[BoardRun], session: FlashSession, interrupted: bool, as_json: bool, fleet: Path | None, ssh_user: str
) -> None:
    """The summary (or JSON), the fleet entries of boards seen booting, and the exit code."""
    from alma.flash.session import EXIT_INTERRUPTED, EXIT_UNRECORDED, overall_exit

    code = overall_exit(runs)
    joins = _join_fleet(runs, fleet, ssh_user)
    if session.record_errors and code == 0:
        code = EXIT_UNRECORDED if any(r.unrecorded for r in runs) else session.record_errors[0].exit_code
    if interrupted:
        code = EXIT_INTERRUPTED  # whatever else happened: the user stopped it
    if as_json:
        emit_json(
            {
                "exit_code": code,
                "records": [{"path": str(r.path), **r.record.to_dict()} for r in runs],
                "fleet": joins,
            }
        )
    else:
        _summary(runs)
        _print_joins(joins)
    if interrupted:
        click.echo("interrupted: every initrd-flash was stopped (see the flash records)", err=True)
    if code:
        sys.exit(code)


class _Display:
    """One progress line per board on a terminal; banners and errors as plain lines otherwise."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.tty = is_tty() and not json_mode
        self.rows: dict[str, dict[str, Any]] = {}
        self.live: Any = None
        self._last_pct = -1

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(show_header=True, box=None)
        for col in ("board", "phase", "elapsed", "last line"):
            table.add_column(col)
        now = time.monotonic()
        for inst, row in self.rows.items():
            # Text objects: script/device lines are never parsed as rich markup ("[/dev/sda]")
            table.add_row(*map(_plain, (inst, row["phase"], f"{now - row['t0']:.0f}s", row["line"][:70])))
        return table

    def event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "prepare":
            pct = int(100 * data["done"] / max(1, data["total"]))
            if pct // 10 != self._last_pct // 10 or pct == 100 and self._last_pct != 100:
                self._last_pct = pct
                click.echo(f"verifying + unpacking bundle: {pct}%", err=True)
        elif kind == "prepared":
            click.echo(f"bundle verified: sha256 {data['sha256']} ({data['members']} files)", err=True)
        elif kind == "start":
            b = data["board"]
            self.rows[b.usb_instance] = {"phase": "start", "line": "", "t0": time.monotonic()}
            if self.tty and self.live is None:
                from rich.live import Live

                self.live = Live(self._render(), console=console(stderr=True), refresh_per_second=4)
                self.live.start()
            elif not self.tty:
                click.echo(f"[{b.usb_instance}] flashing {b.module}", err=True)
        elif kind == "line":
            ev = data["event"]
            row = self.rows.setdefault(ev.usb_instance, {"phase": ev.phase, "line": "", "t0": time.monotonic()})
            row["phase"], row["line"] = ev.phase, ev.line
            if self.live is not None:
                self.live.update(self._render())
            elif ev.banner or ev.line.startswith(("Final status:", "ERR", "ERROR", "WARN", "watching")):
                click.echo(f"[{ev.usb_instance}] {T.terminal(ev.line)}", err=True)
        elif kind == "record-lost":
            err = data["error"]
            secho(f"error: {err.message}", fg="red", err=True)
            click.echo(f"  try: {err.hint}", err=True)
            click.echo(data["json"], err=True)
        elif kind == "warning":
            secho(f"warning: {T.terminal(data['message'])}", fg="yellow", err=True)
        elif kind == "record":
            run = data["run"]
            inst = run.record.board.get("usb_instance") or "-"
            if inst in self.rows:
                self.rows[inst]["phase"] = run.record.result
                if self.live is not None:
                    self.live.update(self._render())

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _join_fleet(runs: list[BoardRun], fleet_file: Path | None, ssh_user: str) -> list[dict[str, Any]]:
    """Boards seen booting join the fleet, one at a time: an identity problem of one
    board (ambiguous, a bad address) is its own reason, never the exit code, never another's."""
    from alma.errors import UserError
    from alma.fleet.join import after_flash

    joins: list[dict[str, Any]] = []
    for r in runs:
        rec = r.record
        inst = rec.board.get("usb_instance")
        problem = rec.boot.identity_problem if rec.boot is not None else None
        if problem and rec.result == "SUCCESS":
            joins.append({"usb_instance": inst, "entry": None, "reason": problem})
            continue
        try:
            joins += after_flash([rec], fleet_file, ssh_user)
        except UserError as exc:
            joins.append({"usb_instance": inst, "entry": None, "reason": f"not added: {exc.message}"})
    return joins


def _print_joins(joins: list[dict[str, Any]]) -> None:
    """The [[node]] entry of every board seen booting (stdout: paste it into the fleet file)."""
    for j in joins:
        if j.get("toml"):
            where = f"added to {j['added_to']}" if j.get("added_to") else "for your fleet file (or --add-to-fleet FILE)"
            click.echo(f"# board {j['usb_instance']}: {where}")
            click.echo(j["toml"])
        if j.get("reason") and not j.get("added_to") and (not j.get("toml") or "not added" in j["reason"]):
            reason = T.terminal(j["reason"])
            secho(f"board {j['usb_instance']}: not joined to the fleet: {reason}", fg="yellow", err=True)


def _plain(value: object) -> Any:
    """Untrusted text for a rich table: sanitized (almaboard.text) and never read as markup."""
    from rich.text import Text

    return Text(T.terminal(value))


def _short(module: str) -> str:
    """'Jetson Orin Nano 8GB / devkit (P3767-0003/-0005)' -> 'Orin Nano 8GB / devkit'."""
    return module.removeprefix("Jetson ").split(" (")[0]


def _summary(runs: list[BoardRun]) -> None:
    rows = []
    for r in runs:
        rec = r.record
        boot = "-" if rec.boot is None else ("booted" if rec.boot.seen else f"not seen: {rec.boot.reason}")
        rows.append(
            (
                str(rec.board.get("usb_instance") or "-"),
                _short(str(rec.board.get("module") or "-")),
                rec.result,
                rec.final_status or "-",
                boot,
                rec.reason or "",
            )
        )
    where = sorted({str(r.path.parent) for r in runs if r.path is not None})
    if is_tty():
        from rich.table import Table

        table = Table("board", "module", "result", "final status", "boot", "reason")
        for row in rows:
            table.add_row(*map(_plain, row))
        console().print(table)
    else:
        for row in rows:
            click.echo("\t".join(T.terminal(c) for c in row))
    for d in where:
        click.echo(f"flash records: {d}", err=True)
