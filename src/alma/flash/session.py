"""One ``alma flash`` run: pick boards, verify and unpack the bundle once, flash each board
in its own copy (concurrently with ``--all``), watch the console, write one flash record
per board and attempt (refusals included) so status labels move on evidence only.

Order matters: everything that can refuse (records dir writable, key files, board state,
bundle/board match from the facts manifest, the lock on the board's device node, hash,
archive safety, space for the unpack and the per-board copies, the bundle's own
``.env.initrd-flash``) runs before the flash script touches a board; a refused board stays
in recovery mode. Interruption (alma.flash.interrupt) is a flag the session polls: every
board still gets its record, with the phases it reached and its logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import text as T

from alma import settings
from alma.artefacts import manifest as facts
from alma.errors import Interrupted, UserError
from alma.flash import bundle as bundles
from alma.flash import discovery, identity, leftovers, privilege, records
from alma.flash.console import INTERRUPTED_REASON, ConsoleWatcher, find_console
from alma.flash.flasher import (
    TRANSCRIPT,
    FlashArgs,
    FlashEvent,
    FlashOutcome,
    InitrdFlasher,
    collect_logs,
    keep_logs,
    transcript_path,
)
from alma.flash.lock import BoardLock
from alma.flash.match import check_fits
from alma.flash.records import Boot, FlashRecord, Phase
from alma.ground import NotARegularFile, file_kind, utc_iso
from alma.tegraflash.names import parse_name
from alma.tegraflash.unpack import DEFAULT_MARGIN, Budget

# Exit codes of `alma flash` (also in its --help and docs/flash.md).
EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_FAILED = 3
EXIT_TIMEOUT = 4
EXIT_NOT_BOOTED = 5
EXIT_UNRECORDED = 6  # a board was touched (flashed, or attempted) but its record could not be written
EXIT_INTERRUPTED = 130
# --all: the worst outcome decides, in this order.
# A board re-enumerates within a second or two between flash stages; gone longer = vanished.
VANISHED_AFTER_S = 2.0
_SEVERITY = [EXIT_INTERRUPTED, EXIT_FAILED, EXIT_TIMEOUT, EXIT_UNRECORDED, EXIT_REFUSED, EXIT_NOT_BOOTED, EXIT_OK]


@dataclass
class FlashOptions:
    bundle: Path | None = None
    machine: str | None = None
    image: str | None = None
    manifest: Path | None = None
    sha256: str | None = None
    board: str | None = None
    all_boards: bool = False
    console: str | None = None  # a port, "auto", or None (no boot watch)
    boot_timeout: float = 300.0
    work_dir: Path | None = None
    records_dir: Path | None = None
    timeouts: dict[str, float] = field(default_factory=dict)
    flash_args: FlashArgs = field(default_factory=FlashArgs)
    unpack_cap: int | None = None  # bytes the unpack may write at most (None: free space decides)
    space_margin: int = DEFAULT_MARGIN
    keep_work: bool = False
    root: Path | None = None  # repository root (facts/)
    identity: Any = None  # an alma.flash.identity.IdentityPlan (names, per-board key)


@dataclass
class BoardRun:
    board: discovery.UsbBoard | None
    record: FlashRecord
    path: Path | None = None  # where the record was written
    error: UserError | None = None  # why it was refused
    unrecorded: bool = False  # the record could not be written (it went to stderr)

    @property
    def exit_code(self) -> int:
        r = self.record
        if self.unrecorded and r.result not in ("REFUSED", "INTERRUPTED"):
            return EXIT_UNRECORDED  # flashed (or attempted): never reported as "refused before touching"
        if r.result == "SUCCESS":
            if r.boot is not None and not r.boot.seen:
                return EXIT_NOT_BOOTED
            return EXIT_OK
        return {"REFUSED": EXIT_REFUSED, "TIMEOUT": EXIT_TIMEOUT, "INTERRUPTED": EXIT_INTERRUPTED}.get(
            r.result, EXIT_FAILED
        )


def overall_exit(runs: list[BoardRun]) -> int:
    codes = {r.exit_code for r in runs}
    for code in _SEVERITY:
        if code in codes:
            return code
    return EXIT_OK


Event = Callable[[str, dict[str, Any]], None]


def _noop(kind: str, data: dict[str, Any]) -> None:
    return None


@dataclass
class BundleChoice:
    path: Path
    expected_sha256: str
    machine: str | None
    image: str | None
    manifest: facts.Manifest | None


def _manifest_value(m: facts.Manifest, name: str) -> Any:
    return m.value(name) if m.has(name) else None


def _abs(root: Path, p: str | os.PathLike[str]) -> Path:
    path = Path(p)
    return path if path.is_absolute() else root / path


def _trusted_manifest(path: Path) -> Path:
    """A manifest chooses the bundle and its sha256: another user's is refused (privilege, 4)."""
    return privilege.trusted_config(
        path, "facts manifest", "use a manifest only you (or root) can write, or pass --sha256 HEX"
    )


def resolve_bundle(opts: FlashOptions) -> BundleChoice:
    """Which bundle, and the sha256 it must have (from the facts manifest, or --sha256)."""
    root = opts.root or settings.repo_root()
    chosen = _choose_manifest(opts, root)
    if chosen is None and opts.sha256 is None:
        where = root / facts.FACTS_DIR
        raise UserError(
            f"no facts manifest for this bundle in {where}: its sha256 cannot be checked",
            hint="alma verify DEPLOY_DIR --machine MACHINE (writes it), or pass the published hash: --sha256 HEX",
        )
    if opts.bundle is not None:
        path = Path(opts.bundle)
    else:
        assert chosen is not None
        bp = _manifest_value(chosen, "bundle_path")
        if not bp:
            raise UserError(
                f"{chosen.path}: fact bundle_path is empty (no bundle was found when alma verify ran)",
                hint="build the image (alma build), then alma verify; or name the bundle: alma flash BUNDLE",
            )
        path = _abs(root, bp)
    expected = _expected_sha256(opts, chosen)
    _check_bundle_file(path, chosen)
    return BundleChoice(
        path=path,
        expected_sha256=expected.lower(),
        machine=(chosen.machine if chosen else opts.machine),
        image=(chosen.image if chosen else opts.image),
        manifest=chosen,
    )


def _choose_manifest(opts: FlashOptions, root: Path) -> facts.Manifest | None:
    """--manifest, or the one facts manifest that fits --machine/--image and the bundle's path or name."""
    if opts.manifest is not None:
        return facts.load_manifest(_trusted_manifest(opts.manifest))
    cands = [facts.load_manifest(_trusted_manifest(p)) for p in facts.find_manifests(root)]
    if opts.machine:
        cands = [m for m in cands if m.machine == opts.machine]
    if opts.image:
        cands = [m for m in cands if m.image == opts.image]
    if opts.bundle is not None and len(cands) != 1:
        real = Path(opts.bundle).resolve()
        by_path = [
            m
            for m in cands
            if _manifest_value(m, "bundle_path") and _abs(root, m.value("bundle_path")).resolve() == real
        ]
        parsed = parse_name(Path(opts.bundle).name)
        by_name = [m for m in cands if parsed is not None and parsed.is_for(str(m.image), m.machine)]
        cands = by_path or by_name
    if len(cands) == 1:
        return cands[0]
    if len(cands) > 1 and opts.sha256 is None:
        names = ", ".join(f"{m.image}-{m.machine}" for m in cands)
        raise UserError(
            f"several facts manifests fit ({names})",
            hint="choose one: alma flash --machine MACHINE [--image IMAGE]",
        )
    return None


def _expected_sha256(opts: FlashOptions, chosen: facts.Manifest | None) -> str:
    expected = opts.sha256
    if expected is None:
        assert chosen is not None
        expected = _manifest_value(chosen, "bundle_sha256")
        if not expected:
            raise UserError(
                f"{chosen.path}: fact bundle_sha256 is empty",
                hint=f"alma verify --machine {chosen.machine} --image {chosen.image}",
            )
    elif chosen is not None and _manifest_value(chosen, "bundle_sha256") not in (None, expected):
        raise UserError(
            f"--sha256 {expected} contradicts the facts manifest {chosen.path} ({chosen.value('bundle_sha256')})",
            hint="drop --sha256, or re-run alma verify",
        )
    return str(expected)


def _check_bundle_file(path: Path, chosen: facts.Manifest | None) -> None:
    """A regular file (stat never blocks, even on a FIFO) of the size the manifest recorded."""
    try:
        st = path.stat()
    except OSError:
        raise UserError(
            f"bundle not found: {path}", hint="alma build, or pass the bundle's path: alma flash BUNDLE"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise NotARegularFile(path, file_kind(st.st_mode))
    if chosen is not None:
        want_bytes = _manifest_value(chosen, "bundle_bytes")
        if isinstance(want_bytes, int) and want_bytes != st.st_size:
            raise UserError(
                f"{path.name}: {st.st_size} bytes, but the facts manifest {chosen.path} recorded "
                f"{want_bytes}: not the verified bundle; refused",
                hint="re-run alma verify on the build host, or copy the right bundle",
            )


def pick_boards(opts: FlashOptions, context: Any = None) -> list[discovery.UsbBoard]:
    if opts.board and opts.all_boards:
        raise UserError("--board and --all exclude each other", hint="alma flash --all  or  alma flash --board 1-8.4")
    if opts.board:
        if not discovery.is_usb_instance(opts.board):
            raise UserError(
                f"--board {T.terminal(opts.board[:40])!r} is not a USB instance (bus-port[.port...], e.g. 1-8.4)",
                hint="alma boards lists them",
            )
        b = discovery.find_board(opts.board, context)
        if not b.in_recovery:
            raise UserError(
                f"board at USB {b.usb_instance} is {b.state} ({b.description}), not in recovery mode",
                hint="put it into recovery mode (alma boards prints how), then flash again",
            )
        return [b]
    found = discovery.recovery_boards(context)
    for b in found:
        if not discovery.is_usb_instance(b.usb_instance):
            # device text names work dirs and records: refused before it becomes a path
            raise UserError(
                f"a board's USB id {T.terminal(b.usb_instance[:40])!r} is not a sysfs name (bus-port[.port...])",
                hint="unplug it, or flash the others one by one: alma flash --board USB_INSTANCE",
            )
    if not found:
        raise UserError(
            "no Jetson in recovery mode on USB (an empty listing is not proof that none is connected)",
            hint="alma boards --wait  (and see `alma boards` for the recovery-mode steps)",
        )
    if len(found) > 1 and not opts.all_boards:
        listed = ", ".join(f"{b.usb_instance} ({b.module})" for b in found)
        raise UserError(
            f"{len(found)} boards in recovery mode: {listed}", hint="choose: --board USB_INSTANCE, or --all"
        )
    return found


class FlashSession:
    def __init__(
        self,
        opts: FlashOptions,
        *,
        flasher: InitrdFlasher | None = None,
        on_event: Event = _noop,
        udev_context: Any = None,
        confirm: Callable[[list[discovery.UsbBoard], BundleChoice], bool] | None = None,
        cancel: threading.Event | None = None,
        urgent: threading.Event | None = None,
    ) -> None:
        self.opts = opts
        self.confirm = confirm
        self.cancel = cancel or (flasher.cancel if flasher is not None else threading.Event())
        self.urgent = urgent or threading.Event()
        self.flasher = flasher or InitrdFlasher(opts.timeouts, args=opts.flash_args, cancel=self.cancel)
        self.flasher.cancel = self.cancel
        self.on_event = on_event
        self.ctx = udev_context
        root = opts.root or settings.repo_root()
        self.records_dir = opts.records_dir or Path(os.environ.get("ALMA_FLASH_RECORDS") or root / records.DEFAULT_DIR)
        self.budget = Budget(cap=opts.unpack_cap, margin=opts.space_margin)
        self.record_errors: list[UserError] = []
        self.evidence: set[Path] = set()  # board dirs whose logs could not be moved to the records
        self.locks: dict[str, BoardLock] = {}  # each board's lock, inherited by its flasher
        self.live_fd: int | None = None  # the run dir's .alma-live lock, inherited by every flasher
        self.shared_before: dict[str, tuple[int, int, int]] = {}  # shared payloads' state before any flash
        self._events_lock = threading.Lock()

    @property
    def interrupted(self) -> bool:
        return self.cancel.is_set()

    # -- records -----------------------------------------------------------------
    def _record(
        self,
        board: discovery.UsbBoard | None,
        choice: BundleChoice | None,
        started: str,
        result: str,
        *,
        reason: str | None = None,
        sha256: str | None = None,
        machine: str | None = None,
        phases: list[Phase] | None = None,
    ) -> FlashRecord:
        return FlashRecord(
            board=board.record_board() if board else ({"usb_instance": self.opts.board} if self.opts.board else {}),
            bundle_sha256=sha256 or (choice.expected_sha256 if choice else ""),
            bundle_path=str(choice.path if choice else (self.opts.bundle or "")),
            machine=machine or (choice.machine if choice else None) or self.opts.machine or "unknown",
            image=choice.image if choice else self.opts.image,
            started=started,
            finished=utc_iso(),
            result=result,
            reason=reason,
            phases=list(phases or []),
            options=self.opts.flash_args.record(),
        )

    def _save(self, run: BoardRun, path: Path | None = None) -> BoardRun:
        try:
            run.path = records.save(run.record, self.records_dir, path)
        except OSError as exc:
            # The disk filled up (or went read-only) since the probe: say so, and put the
            # record where it can still be read (stderr), so the evidence is not lost.
            err = UserError(
                f"cannot write the flash record to {self.records_dir}: {exc.strerror or exc}",
                hint="free space there; the record follows on stderr: save it as a .json in facts/flash-records/",
            )
            self.record_errors.append(err)
            run.unrecorded = True
            self._emit("record-lost", {"error": err, "json": json.dumps(run.record.to_dict(), sort_keys=True)})
        self._emit("record", {"run": run})
        return run

    def _emit(self, kind: str, data: dict[str, Any]) -> None:
        with self._events_lock:
            self.on_event(kind, data)

    def refuse(
        self, exc: UserError, board: discovery.UsbBoard | None, choice: BundleChoice | None, started: str, **kw: Any
    ) -> BoardRun:
        rec = self._record(board, choice, started, "REFUSED", reason=exc.message, **kw)
        return self._save(BoardRun(board, rec, error=exc))

    def _interrupted_before(
        self, board: discovery.UsbBoard, choice: BundleChoice, started: str, phases: list[Phase], **kw: Any
    ) -> BoardRun:
        rec = self._record(
            board,
            choice,
            started,
            "INTERRUPTED",
            reason=f"interrupted ({self.flasher.stop_cause}) before the board was touched; nothing was flashed",
            phases=phases,
            **kw,
        )
        return self._save(BoardRun(board, rec))

    # -- the run -----------------------------------------------------------------
    def run(self) -> list[BoardRun]:
        started = utc_iso()
        # another user's records dir could aim root's writes anywhere: refuse before writing one
        self.records_dir = privilege.trusted_base(self.records_dir, "records dir", "--records-dir")
        records.probe_writable(self.records_dir)  # no record could be written: refuse first
        try:
            self.opts.flash_args.check()
            self.flasher.check()
            boards = pick_boards(self.opts, self.ctx)
            if self.opts.identity is not None:  # name every board before touching one
                self.opts.identity.bind([b.usb_instance for b in boards])
        except UserError as exc:
            self.refuse(exc, None, None, started)
            raise
        try:
            choice = resolve_bundle(self.opts)
        except UserError as exc:
            for b in boards:
                self.refuse(exc, b, None, started)
            raise

        runs: list[BoardRun] = []
        fitting: list[discovery.UsbBoard] = []
        # Cheap pre-check from the manifest (the bundle's own env is checked again below).
        env_machine = _manifest_value(choice.manifest, "env_machine") if choice.manifest else None
        env_chipid = _manifest_value(choice.manifest, "env_chipid") if choice.manifest else None
        for b in boards:
            try:
                if env_machine:
                    check_fits(str(env_machine), env_chipid, b.vendor, b.product, b.usb_instance)
                fitting.append(b)
            except UserError as exc:
                runs.append(self.refuse(exc, b, choice, started, machine=str(env_machine)))
        locks = self.locks
        for b in list(fitting):
            lk = BoardLock(b.usb_instance, b.devnode)
            try:
                lk.acquire()
                locks[b.usb_instance] = lk
            except UserError as exc:
                fitting.remove(b)
                runs.append(self.refuse(exc, b, choice, started))
        try:
            if fitting and self.confirm is not None and not self.confirm(fitting, choice):
                raise UserError("not confirmed: nothing was flashed", hint="pass --yes to flash without asking")
            if fitting and self.interrupted:
                runs += [self._interrupted_before(b, choice, started, []) for b in fitting]
            elif fitting:
                runs += self._prepare_and_flash(fitting, choice, started)
        finally:
            for lk in locks.values():
                lk.release()
        if len(boards) == 1 and runs and runs[0].error is not None and not self.interrupted:
            raise runs[0].error
        return runs

    def _work_dir(self) -> Path:
        base = self.opts.work_dir or Path(
            os.environ.get("ALMA_FLASH_WORKDIR")
            or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alma" / "flash"
        )
        base = privilege.trusted_base(base, "work dir", "--work-dir")  # UntrustedPath: a REFUSED record per board
        try:
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            for msg in leftovers.clean_stale_runs(base, on_killed=self._killed_record):
                self._emit("warning", {"message": msg})
            run = Path(tempfile.mkdtemp(prefix="run-", dir=base))
            self.live_fd = leftovers.mark_run(run)
            return run
        except OSError as exc:
            raise UserError(
                f"cannot create a work directory in {base}: {exc.strerror or exc}",
                hint="choose another place: alma flash --work-dir DIR",
            ) from exc

    def _killed_record(self, k: leftovers.KilledFlash) -> None:
        """The record of a board whose alma was killed while its flasher ran (found at this start)."""
        info = k.info
        ended = utc_iso(k.ended) if k.ended else None
        rec = FlashRecord(
            board=info.get("board") if isinstance(info.get("board"), dict) else {},
            bundle_sha256=str(info.get("sha256") or ""),
            bundle_path=str(info.get("bundle_path") or ""),
            machine=str(info.get("machine") or "unknown"),
            image=str(info["image"]) if info.get("image") else None,
            started=str(info.get("started") or ""),
            finished=ended or utc_iso(),
            result="INTERRUPTED",
            reason=f"interrupted: alma killed (pid {k.alma_pid}), flasher ran until {ended or 'an unknown time'}; "
            "the board's state is unknown: flash it again",
            options=info.get("options") if isinstance(info.get("options"), dict) else {},
        )
        path = records.next_path(rec, self.records_dir)
        host_log, device_logs = collect_logs(k.board_dir) if k.board_dir.is_dir() else (None, None)
        transcript = transcript_path(k.board_dir)
        outcome = FlashOutcome(
            "INTERRUPTED", rec.reason, None, None, host_log=host_log, device_logs=device_logs,
            transcript=transcript if transcript.is_file() else None,
        )  # fmt: skip
        with contextlib.suppress(OSError):
            rec.logs = {
                key: _rel(v, self.records_dir) for key, v in keep_logs(outcome, path.with_suffix(".logs")).items()
            }
        self._save(BoardRun(None, rec), path)
        self._emit("warning", {"message": f"{rec.board.get('usb_instance', '?')}: {rec.reason}"})

    def _prepare_and_flash(
        self, boards: list[discovery.UsbBoard], choice: BundleChoice, started: str
    ) -> list[BoardRun]:
        try:
            work = self._work_dir()
        except UserError as exc:
            return [self.refuse(exc, b, choice, started) for b in boards]
        try:
            return self._in_work(work, boards, choice, started)
        finally:
            if self.evidence and not self.opts.keep_work:
                _prune_to_logs(work, self.evidence)
            elif not self.opts.keep_work:
                shutil.rmtree(work, ignore_errors=True)
            if self.live_fd is not None:
                os.close(self.live_fd)
                self.live_fd = None

    def _in_work(
        self, work: Path, boards: list[discovery.UsbBoard], choice: BundleChoice, started: str
    ) -> list[BoardRun]:
        prep_phase = Phase("prepare", utc_iso())
        try:
            prepared = bundles.prepare(
                choice.path,
                work,
                choice.expected_sha256,
                progress=lambda done, total: self._emit("prepare", {"done": done, "total": total}),
                budget=self.budget,
                cancel=self.cancel,
            )
        except Interrupted:
            prep_phase.finished, prep_phase.result = utc_iso(), "interrupted"
            return [self._interrupted_before(b, choice, started, [prep_phase]) for b in boards]
        except UserError as exc:
            prep_phase.finished, prep_phase.result = utc_iso(), "failed"
            sha = _actual_sha(exc.message)
            return [self.refuse(exc, b, choice, started, phases=[prep_phase], sha256=sha) for b in boards]
        prep_phase.finished, prep_phase.result = utc_iso(), "ok"
        self._emit("prepared", {"sha256": prepared.sha256, "members": prepared.members})
        kw = {"sha256": prepared.sha256, "machine": prepared.env.machine}

        runs: list[BoardRun] = []
        ok: list[discovery.UsbBoard] = []
        for b in boards:
            try:
                check_fits(prepared.env.machine, prepared.env.chipid, b.vendor, b.product, b.usb_instance)
                ok.append(b)
            except UserError as exc:
                runs.append(self.refuse(exc, b, choice, started, phases=[prep_phase], **kw))
        if not ok:
            return runs
        try:
            bundles.check_copy_space(prepared, len(ok), self.budget, work)
        except UserError as exc:
            return runs + [self.refuse(exc, b, choice, started, phases=[prep_phase], **kw) for b in ok]
        self.shared_before = bundles.shared_payload_state(prepared)
        pool = ThreadPoolExecutor(max_workers=len(ok), thread_name_prefix="flash")
        futures: dict[Future[BoardRun], discovery.UsbBoard] = {
            pool.submit(self._flash_one, b, prepared, choice, started, prep_phase, work): b for b in ok
        }
        try:
            self._wait_all(list(futures))
        finally:
            pool.shutdown(wait=True)
        for f, b in futures.items():
            failure = f.exception()
            if isinstance(failure, UserError):
                runs.append(self.refuse(failure, b, choice, started, phases=[prep_phase], **kw))
            elif failure is not None:
                raise failure
            else:
                runs.append(f.result())
        return runs

    def _wait_all(self, futures: list[Future[BoardRun]]) -> None:
        """Wait in short steps (never blocked in one long wait): a second signal kills at once."""
        pending = set(futures)
        killed = False
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            if self.urgent.is_set() and not killed:
                killed = True
                self.flasher.kill_all()

    def board_copy(self, board: discovery.UsbBoard, prepared: bundles.PreparedBundle, work: Path) -> Path:
        """This board's private copy of the bundle: the one place per-board files go."""
        board_dir = work / "boards" / board.usb_instance.replace("/", "_")
        board_dir.parent.mkdir(exist_ok=True, mode=0o700)
        bundles.clone_for_board(prepared, board_dir)
        return board_dir

    def _flash_one(
        self,
        board: discovery.UsbBoard,
        prepared: bundles.PreparedBundle,
        choice: BundleChoice,
        started: str,
        prep_phase: Phase,
        work: Path,
    ) -> BoardRun:
        kw = {"sha256": prepared.sha256, "machine": prepared.env.machine}
        if self.interrupted:
            return self._interrupted_before(board, choice, started, [prep_phase], **kw)
        board_dir = self.board_copy(board, prepared, work)
        ident = self.opts.identity.assigned.get(board.usb_instance) if self.opts.identity else None  # name + key
        if ident is not None:
            try:
                identity.write_board_config(board_dir, ident)
            except UserError as exc:
                return self.refuse(exc, board, choice, started, phases=[prep_phase], sha256=prepared.sha256)
        if self.interrupted:
            return self._interrupted_before(board, choice, started, [prep_phase], **kw)
        self._emit("start", {"board": board})

        watcher, port = self._console(board)

        def on_line(ev: FlashEvent) -> None:
            if watcher is not None and ev.line.startswith("Final status:"):
                watcher.mark()  # the board reboots into the new system now
            self._emit("line", {"event": ev})

        rec = self._record(board, choice, started, "FAILED", **kw)
        rec.phases = [prep_phase]
        rec.identity = ident.to_record() if ident is not None else None
        try:  # invariant 3 of alma.flash.privilege: what runs is what was hashed
            privilege.verify_script(work, board_dir, prepared.script_sha256)
        except UserError as exc:
            if watcher is not None:
                watcher.stop()
            return self.refuse(exc, board, choice, started, phases=[prep_phase], **kw)
        info = {
            "board": board.record_board(),
            "board_dir": board_dir.name,
            "sha256": prepared.sha256,
            "bundle_path": str(choice.path),
            "machine": prepared.env.machine,
            "image": choice.image,
            "started": started,
            "options": self.opts.flash_args.record(),
        }
        leftovers.mark_flasher(work, board.usb_instance, info)  # what the next start needs if alma is killed
        lock = self.locks.get(board.usb_instance)
        keep = tuple(fd for fd in (lock.fd if lock is not None else None, self.live_fd) if fd is not None)
        presence = discovery.PresenceWatch(board.usb_instance, self.ctx).start()
        try:
            outcome = self.flasher.flash(board_dir, board.usb_instance, on_line, pass_fds=keep)
            presence.stop()
            rec.result = outcome.result
            rec.reason = _vanished(outcome, presence, board.usb_instance) or outcome.reason
            rec.exit_code = outcome.exit_code
            rec.final_status = outcome.final_status
            rec.phases += outcome.phases
            rec.warnings = list(outcome.warnings)
            rec.finished = utc_iso()
            changed = self._shared_changed(prepared)
            if changed:
                rec.result = "FAILED"
                rec.reason = (
                    f"the shared payload {', '.join(changed)} changed while board {board.usb_instance} was flashed "
                    "(one hard-linked copy serves every board and initrd-flash must only read it): this flash is "
                    f"not trusted; flash the board again (initrd-flash: {outcome.reason or outcome.result})"
                )
            run = self._after_flash(board, board_dir, rec, outcome, watcher, port)
            leftovers.flasher_done(work, board.usb_instance)
            return run
        finally:
            presence.stop()
            if watcher is not None:
                watcher.stop()

    def _shared_changed(self, prepared: bundles.PreparedBundle) -> list[str]:
        """The shared (hard-linked) payloads whose size or mtime moved since the flashes began."""
        now = bundles.shared_payload_state(prepared)
        return sorted(p for p, st in self.shared_before.items() if now.get(p) != st)

    def _console(self, board: discovery.UsbBoard) -> tuple[ConsoleWatcher | None, str | None]:
        """The board's console, watched from before the flash (None: the boot is not watched)."""
        port = self.opts.console
        if port == "auto":
            port = find_console(board.sys_path or None, self.ctx, only_one_ok=not self.opts.all_boards)
            if port is None:
                self._emit(
                    "warning", {"message": f"{board.usb_instance}: no USB serial console found; boot not watched"}
                )
        if not port:
            return None, None
        watcher = ConsoleWatcher(port)
        watcher.start()
        return watcher, port

    def _after_flash(
        self,
        board: discovery.UsbBoard,
        board_dir: Path,
        rec: FlashRecord,
        outcome: FlashOutcome,
        watcher: ConsoleWatcher | None,
        port: str | None,
    ) -> BoardRun:
        """The flash's logs next to its record, the boot watch, the record itself."""
        run = BoardRun(board, rec)
        path = records.next_path(rec, self.records_dir)
        logs_dir = path.with_suffix(".logs")
        try:
            rec.logs = keep_logs(outcome, logs_dir)
            rec.logs = {k: _rel(v, self.records_dir) for k, v in rec.logs.items()}
        except OSError as exc:
            # the evidence stays in the board's work dir, which is kept (not removed)
            self.evidence.add(board_dir)
            rec.logs = {"error": f"logs not moved to {logs_dir}: {exc.strerror or exc}", "kept_in": str(board_dir)}
            self._emit("warning", {"message": f"{board.usb_instance}: the flash logs are kept in {board_dir}"})
        if watcher is not None and outcome.result == "SUCCESS" and not self.interrupted:
            boot_phase = Phase("boot", utc_iso())
            self._emit("line", {"event": FlashEvent(board.usb_instance, "boot", f"watching {port} for a login prompt")})
            rec.boot = watcher.wait_for_boot(self.opts.boot_timeout, cancel=self.cancel)
            boot_phase.finished = utc_iso()
            boot_phase.result = boot_phase_result(rec.boot, self.interrupted)
            rec.phases.append(boot_phase)
            rec.finished = utc_iso()
        elif port and outcome.result == "SUCCESS":
            rec.boot = Boot(seen=False, console=port, reason="console could not be watched")
        self._save(run, path)
        if run.unrecorded:
            self.evidence.add(board_dir)
            self._emit("warning", {"message": f"{board.usb_instance}: the flash logs are kept in {board_dir}"})
        return run


def boot_phase_result(boot: Boot, interrupted: bool) -> str:
    """ok | interrupted (Ctrl-C/SIGTERM while watching: never "failed") | timeout | failed."""
    if boot.seen:
        return "ok"
    if interrupted or boot.reason == INTERRUPTED_REASON:
        return "interrupted"
    return "timeout" if "timeout" in (boot.reason or "") else "failed"


def _prune_to_logs(work: Path, keep: set[Path]) -> None:
    """Free the work dir's space but keep every log of the boards in ``keep`` (their host
    log, device logs and transcript): a full disk must not cost the evidence."""
    for entry in work.iterdir():
        if entry.name != "boards":
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    for board_dir in (work / "boards").iterdir() if (work / "boards").is_dir() else []:
        if board_dir.name.endswith("." + TRANSCRIPT):
            if board_dir.with_name(board_dir.name.removesuffix("." + TRANSCRIPT)) not in keep:
                board_dir.unlink(missing_ok=True)
            continue
        if board_dir not in keep:
            shutil.rmtree(board_dir, ignore_errors=True)
            continue
        for entry in board_dir.iterdir():
            if entry.name.startswith(("log.initrd-flash.", "device-logs-", "alma-initrd-flash.log")):
                continue
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def _vanished(outcome: FlashOutcome, presence: discovery.PresenceWatch, usb_instance: str) -> str | None:
    """ "Vanished" only when udev saw the board leave while the protocol needs it on USB (the
    write); the host's own power-offs between steps remove the gadget by design."""
    if outcome.result in ("SUCCESS", "INTERRUPTED") or presence.gone_since is None or outcome.tracker is None:
        return None
    gone = presence.gone_for()
    if gone is None or gone < VANISHED_AFTER_S or not outcome.tracker.must_be_present_at(presence.gone_since):
        return None
    return (
        f"the board vanished from USB {usb_instance} during the write ({gone:.0f} s before the end) and did not "
        f"come back (check the cable and the board's power); initrd-flash: {outcome.reason}"
    )


def _rel(value: Any, base: Path) -> Any:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return str(Path(value).relative_to(base))
        return value
    if isinstance(value, list):
        return [_rel(v, base) for v in value]
    return value


def _actual_sha(message: str) -> str | None:
    marker = "the file is "
    if marker in message:
        return message.split(marker, 1)[1].split()[0].strip(";,")
    return None
