"""labgrid drivers: flash with ``alma flash``'s code, put a board into recovery mode, ssh in pinned.

- ``AlmaFlashDriver`` flashes a bundle onto the bound ``AlmaRecoveryBoard`` (in this process,
  through ``FlashSession``) or ``NetworkAlmaRecoveryBoard`` (through the exporter's flash
  service, which runs the same ``FlashSession`` on the exporter's host). Either way the
  expected sha256 comes from *this* side's facts manifest (or ``sha256:``), exactly as
  ``alma flash`` resolves it; the record is returned; any result but SUCCESS raises
  ``FlashFailed`` carrying the record and its reason.
- ``AlmaRecoveryDriver`` powers the board (on/off/cycle boot normally) and puts it into
  recovery mode: recovery line (any ``DigitalOutputProtocol``: GPIO, relay,
  FTDI bit) held while the power (any ``PowerProtocol``) is cycled, the way the Orin Nano
  devkit's FC_REC pin or the AGX Orin's Force Recovery button work.
- ``AlmaSSHDriver`` is labgrid's ``SSHDriver`` with the board's host key pinned (the
  fingerprint from the console identity line, or a full key): labgrid's own driver turns
  host key checking off.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import attr
from almaboard.text import terminal
from labgrid.driver.common import Driver
from labgrid.driver.sshdriver import SSHDriver
from labgrid.factory import target_factory
from labgrid.protocol import DigitalOutputProtocol, PowerProtocol
from labgrid.step import step
from labgrid.util.proxy import proxymanager

from alma import runner, settings
from alma.errors import ConfigError, ToolError, UserError
from alma.flash.flasher import DEFAULT_TIMEOUTS, FlashArgs
from alma.flash.records import FlashRecord
from alma.flash.session import FlashOptions, FlashSession, resolve_bundle
from alma.labgrid import service
from alma.labgrid.resource import USB_PATH, NetworkAlmaRecoveryBoard
from alma.sshkeys import FINGERPRINT, BadKey, parse_host_key, parse_public_key

KEYSCAN_TIMEOUT_S = 10


class FlashFailed(ToolError):
    """The flash did not succeed; ``record`` is its flash record (written where it ran)."""

    def __init__(self, message: str, record: FlashRecord | None, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.record = record


def _seconds(v: Any) -> float | None:
    return None if v is None else float(v)


@target_factory.reg_driver
@attr.s(eq=False)
class AlmaFlashDriver(Driver):
    bindings = {"board": {"AlmaRecoveryBoard", "NetworkAlmaRecoveryBoard"}}

    image = attr.ib(default="bundle", validator=attr.validators.instance_of(str))  # key under images:
    manifest = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))
    sha256 = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))
    timeouts = attr.ib(factory=dict, validator=attr.validators.instance_of(dict))  # phase -> seconds
    boot_timeout: float | None = attr.ib(default=None, converter=_seconds)
    erase_nvme = attr.ib(default=False, validator=attr.validators.instance_of(bool))
    skip_bootloader = attr.ib(default=False, validator=attr.validators.instance_of(bool))
    connect_timeout = attr.ib(default=30.0, converter=float)
    always_upload = attr.ib(default=False, validator=attr.validators.instance_of(bool))
    # added to the sum of the phase limits and the boot watch: one deadline for the whole flash
    deadline_slack = attr.ib(default=120.0, converter=float)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.last_record: FlashRecord | None = None

    def on_activate(self) -> None:
        pass

    def on_deactivate(self) -> None:
        pass

    def _bundle_path(self, bundle: str | os.PathLike[str] | None) -> Path:
        if bundle is not None:
            return Path(bundle)
        if self.target.env is None:
            raise UserError("no bundle given and no labgrid environment to take images: from",
                            hint="flash(bundle=PATH), or images: {bundle: PATH} in the env file")  # fmt: skip
        return Path(self.target.env.config.get_image_path(self.image))

    def _options(self, path: Path) -> FlashOptions:
        manifest = None
        if self.manifest is not None:
            manifest = Path(self.manifest)
            if self.target.env is not None:
                manifest = Path(self.target.env.config.resolve_path(self.manifest))
        return FlashOptions(
            bundle=path,
            manifest=manifest,
            sha256=self.sha256.lower() if self.sha256 else None,
            timeouts={k: float(v) for k, v in self.timeouts.items()},
            flash_args=FlashArgs(erase_nvme=self.erase_nvme, skip_bootloader=self.skip_bootloader),
        )

    @Driver.check_active
    @step(args=["bundle"], result=True)
    def flash(self, bundle: str | os.PathLike[str] | None = None) -> FlashRecord:
        """Flash ``bundle`` (default: the env's ``images: {bundle: ...}``); return its record."""
        opts = self._options(self._bundle_path(bundle))
        choice = resolve_bundle(opts)  # the expected hash, from this side's facts (alma flash's rule)
        opts.sha256 = choice.expected_sha256
        if isinstance(self.board, NetworkAlmaRecoveryBoard):
            rec, where = self._flash_remote(choice.path, opts)
        else:
            rec, where = self._flash_local(opts)
        self.last_record = rec
        usb = terminal(str(rec.board.get("usb_instance", "?")))
        if rec.result != "SUCCESS":
            raise FlashFailed(
                f"flash of {choice.path.name} onto USB {usb} {terminal(rec.result)}: "
                f"{terminal(rec.reason or 'no reason recorded')}",
                rec,
                hint=f"the flash record is {terminal(where)}",
            )
        self.logger.info("flashed USB %s: record %s", usb, terminal(where))
        return rec

    def _flash_local(self, opts: FlashOptions) -> tuple[FlashRecord, str]:
        opts.board = self.board.usb_path or self.board.path
        opts.console = self.board.console
        if self.boot_timeout is not None:
            opts.boot_timeout = self.boot_timeout
        runs: list[Any] = []

        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "record":
                runs.append(data["run"])
            elif kind == "line":
                self.logger.debug("%s", terminal(data["event"].line))

        try:
            FlashSession(opts, on_event=on_event).run()
        except UserError as exc:
            if not runs:
                raise
            return runs[-1].record, f"{runs[-1].path} ({exc.message})"
        return runs[-1].record, str(runs[-1].path)

    def _flash_remote(self, path: Path, opts: FlashOptions) -> tuple[FlashRecord, str]:
        res = self.board
        # Everything below came from the exporter through the coordinator, and labgrid updates a
        # remote resource's attributes without running their validators: checked here, at use.
        exporter = terminal(str(res.host))
        usb_path = res.usb_path
        if not isinstance(usb_path, str) or not USB_PATH.fullmatch(usb_path):
            raise UserError(
                f"the exporter on {exporter} published no valid usb_path for its board ({terminal(repr(usb_path))})",
                hint="its exporter config must name the board's USB path (alma boards); is it alma-labgrid-exporter?",
            )
        if res.port is None:
            raise UserError(
                f"the exporter on {exporter} runs no flash service for USB {usb_path}",
                hint="acquire the place first (labgrid-client -p PLACE acquire); exporter: alma-labgrid-exporter",
            )
        try:
            host, port = proxymanager.get_host_and_port(res)
        except ValueError:  # a host that is no host[:port]
            host, port = None, None
        if not _is_port(res.port) or not _is_port(port) or not isinstance(host, str) or not host:
            raise UserError(
                f"the exporter on {exporter} published no valid address for the flash service of USB {usb_path} "
                f"({terminal(repr(res.host))}, port {terminal(repr(res.port))})",
                hint="is it alma-labgrid-exporter of this version? labgrid-client -v resources shows what it published",
            )
        where = f"{exporter}:{port}"
        size = path.stat().st_size
        request: dict[str, Any] = {
            "proto": service.PROTO,
            "op": "flash",
            "name": path.name,
            "size": size,
            "sha256": opts.sha256,
            "options": {
                "erase_nvme": self.erase_nvme,
                "skip_bootloader": self.skip_bootloader,
                "timeouts": opts.timeouts,
                **({"boot_timeout": self.boot_timeout} if self.boot_timeout is not None else {}),
            },
        }
        if not self.always_upload:
            request["path"] = str(path.resolve())
        request_check = {**request, "usb_path": usb_path}
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout)
            _keepalive(sock)  # the flash can be silent for minutes: a vanished exporter host must still show
        except OSError as exc:
            raise UserError(
                f"cannot reach the flash service of USB {usb_path} on {where}: {exc.strerror or exc}",
                hint="is the exporter running and the place still acquired? labgrid-client -p PLACE show",
            ) from None
        with sock:
            try:
                return self._talk(sock, request, path, where, request_check)
            except (OSError, service.ProtocolError) as exc:
                raise FlashFailed(
                    f"lost the flash service on {where} mid-flash ({getattr(exc, 'message', None) or exc}): "
                    "the exporter stopped or its host went away; its record there says what was done",
                    None,
                    hint=f"look at the flash records on {exporter}; release the place: labgrid-client release",
                ) from None

    def _talk(
        self, sock: socket.socket, request: dict[str, Any], path: Path, where: str, asked: dict[str, Any]
    ) -> tuple[FlashRecord, str]:
        service.send(sock, request)
        reader = service.LineReader(sock)
        sock.settimeout(self.connect_timeout)
        try:
            answer = reader.read()
        except TimeoutError:
            # connected (the kernel queued us) but never served: one flash at a time per service
            raise UserError(
                f"the flash service on {where} did not answer within {self.connect_timeout:.0f} s: "
                "busy with another flash of this board, or stuck; nothing was flashed",
                hint="wait for the other flash (labgrid-client -v resources shows 'flashing'), then retry",
            ) from None
        if answer is None:
            raise service.ProtocolError("the service closed the connection")
        if "error" in answer:
            raise _peer_error(where, answer)
        if answer.get("upload"):
            with open(path, "rb") as fh:
                while chunk := fh.read(service.CHUNK):
                    sock.sendall(chunk)  # each send bounded by the connect timeout: a peer that stops reading
        limit = self.overall_limit()
        end = time.monotonic() + limit
        while True:
            try:
                msg = reader.read(deadline=end)  # reads wake every IDLE_S at most; the deadline holds
            except TimeoutError:
                continue  # quiet, and the deadline not reached: a long phase may be silent
            except service.ProtocolError as exc:
                if time.monotonic() < end:
                    raise
                raise FlashFailed(
                    f"no flash record from the flash service on {where} within {limit:.0f} s (the sum of the "
                    "phase limits, the boot watch and the slack): it stalled, or drips output without ending",
                    None,
                    hint="look at the flash records on the exporter; raise timeouts:/deadline_slack: if it was working",
                ) from exc
            if msg is None:
                raise service.ProtocolError("the connection closed before the flash record came")
            if msg.get("event") == "line":
                self.logger.debug("%s", terminal(str(msg.get("text", ""))))
                continue
            if msg.get("event") == "probe":
                continue  # the service asking whether a half-closed client still reads
            if "result" in msg:
                rec = _peer_record(msg["result"])
                _matches(rec, asked, where)
                return rec, f"{terminal(str(msg.get('record_path')))} on {where.rsplit(':', 1)[0]}"
            if "error" in msg:
                raise _peer_error(where, msg)
            raise service.ProtocolError("unexpected message from the flash service")

    def overall_limit(self) -> float:
        """Seconds the whole remote flash may take once the bundle is sent: every phase at its limit."""
        phases = {**DEFAULT_TIMEOUTS, **{k: float(v) for k, v in self.timeouts.items()}}
        boot = self.boot_timeout if self.boot_timeout is not None else FlashOptions.boot_timeout
        return sum(phases.values()) + boot + self.deadline_slack


def _matches(rec: FlashRecord, request: dict[str, Any], where: str) -> None:
    """A SUCCESS must be the flash that was asked for: this bundle's sha256, onto this board."""
    if rec.result != "SUCCESS":
        return  # not accepted anyway (FlashFailed with its reason)
    names = {request["name"]} | ({Path(request["path"]).name} if request.get("path") else set())
    wrong = []
    if rec.bundle_sha256 != request["sha256"]:
        wrong.append(f"sha256 {terminal(str(rec.bundle_sha256)[:64])}, asked {request['sha256']}")
    if rec.board.get("usb_instance") != request["usb_path"]:
        wrong.append(f"board {terminal(str(rec.board.get('usb_instance'))[:40])}, asked {request['usb_path']}")
    if not isinstance(rec.bundle_path, str) or Path(rec.bundle_path).name not in names:
        wrong.append(f"bundle {terminal(str(rec.bundle_path)[:120])}, asked {request['name']}")
    if wrong:
        raise FlashFailed(
            f"the flash service on {where} returned a SUCCESS record of another flash ({'; '.join(wrong)}): "
            "not accepted",
            rec,
            hint="the exporter is broken or not the one this place names: look at its flash records",
        )


def _is_port(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536


def _keepalive(sock: socket.socket) -> None:
    """TCP keepalive: a peer host gone without a word is noticed in about a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def _peer_error(where: str, msg: dict[str, Any]) -> UserError:
    hint = msg.get("hint")
    return UserError(f"{where}: {terminal(str(msg['error']))}", hint=terminal(hint) if isinstance(hint, str) else None)


def _peer_record(data: Any) -> FlashRecord:
    """The flash service's record, checked to the shape this side relies on (the peer is an
    exporter: its words are data, never trusted structure)."""
    try:
        rec = FlashRecord.from_dict(data)
    except ConfigError as exc:
        raise service.ProtocolError(f"the flash service sent no flash record: {exc.message}") from None
    if (
        not isinstance(rec.result, str)
        or not isinstance(rec.reason, str | None)
        or not isinstance(rec.board, dict)
        or not isinstance(rec.final_status, str | None)
        or (rec.boot is not None and not _boot_ok(rec.boot))
    ):
        raise service.ProtocolError("the flash service sent a malformed flash record")
    return rec


def _boot_ok(boot: Any) -> bool:
    strs = (boot.console, boot.reason, boot.login_prompt, boot.identity_problem)
    return (
        isinstance(boot.seen, bool)
        and all(isinstance(v, str | None) for v in strs)
        and (boot.board is None or (isinstance(boot.board, dict) and isinstance(boot.board.get("hostkey"), str)))
    )


@target_factory.reg_driver
@attr.s(eq=False)
class AlmaRecoveryDriver(Driver):
    """Power through any PowerProtocol driver, plus recovery mode through a digital output.

    Not a PowerProtocol itself: `labgrid-client power` keeps finding the one power driver."""

    bindings = {"power": PowerProtocol, "recovery": DigitalOutputProtocol}
    off_s = attr.ib(default=2.0, converter=float)  # Orin modules need ~1 s off to reset cleanly
    hold_s = attr.ib(default=2.0, converter=float)  # recovery line held this long after power on
    invert = attr.ib(default=False, validator=attr.validators.instance_of(bool))  # line active-low

    def on_activate(self) -> None:
        self.recovery.set(self.invert)  # released: a normal boot unless asked otherwise

    def on_deactivate(self) -> None:
        pass

    def _line(self, asserted: bool) -> None:
        self.recovery.set(asserted != self.invert)

    @Driver.check_active
    @step()
    def on(self) -> None:
        self._line(False)
        self.power.on()

    @Driver.check_active
    @step()
    def off(self) -> None:
        self.power.off()

    @Driver.check_active
    @step()
    def cycle(self) -> None:
        self.power.off()
        time.sleep(self.off_s)
        self.on()

    @Driver.check_active
    @step()
    def enter_recovery(self) -> None:
        """Power off, hold the recovery line, power on, release it: the BootROM waits for RCM."""
        self.power.off()
        self._line(True)
        try:
            time.sleep(self.off_s)
            self.power.on()
            time.sleep(self.hold_s)
        finally:
            self._line(False)


def _host_key_line(alias: str, pin: str, address: str, port: int) -> str:
    """``alias <type> <base64>`` for the pinned key; a fingerprint is resolved by one bounded scan
    for the board's ed25519 key (the identity line's fingerprint is that key's, docs/formats.md;
    asking for types the server lacks made ssh-keyscan wait out its timeout)."""
    pinned = parse_host_key(pin, "host_key")
    if not FINGERPRINT.fullmatch(pinned):
        return f"{alias} {pinned}\n"
    res = runner.capture(
        [settings.tool("ssh-keyscan"), "-T", str(KEYSCAN_TIMEOUT_S), "-p", str(port), "-t", "ed25519",
         "--", address],
        timeout=KEYSCAN_TIMEOUT_S * 3 + 5, check=False, stderr="separate",
    )  # fmt: skip
    for ln in res.lines:
        parts = ln.split()
        if len(parts) < 3 or ln.startswith("#"):
            continue
        try:
            key = parse_public_key(" ".join(parts[1:3]))
        except BadKey:
            continue
        if key.fingerprint == pinned:
            return f"{alias} {key.type} {key.blob_b64}\n"
    raise UserError(
        f"{address}:{port} offers no host key with the pinned fingerprint {pinned}: not the board that was flashed",
        hint="check the board's console identity line (alma-board: ... hostkey=); never connect unpinned",
    )


@target_factory.reg_driver
@attr.s(eq=False)
class AlmaSSHDriver(SSHDriver):
    """SSHDriver that verifies the board's host key (``host_key``: a SHA256 fingerprint or a key)."""

    host_key = attr.ib(default=None, validator=attr.validators.optional(attr.validators.instance_of(str)))

    def _start_own_master_once(self, timeout: int) -> Any:
        if not self.host_key:
            raise UserError(
                "AlmaSSHDriver: no pinned host key for the board",
                hint="set host_key (the fingerprint from the console line alma-board: ... hostkey=SHA256:...)",
            )
        ns = self.networkservice
        alias = f"alma-board-{ns.address}"
        pin_dir = Path(tempfile.mkdtemp(prefix="alma-lg-pin-"))
        known = pin_dir / "known_hosts"
        known.write_text(_host_key_line(alias, self.host_key, ns.address, ns.port))
        # ssh takes the first value of each option: these come before labgrid's own
        # UserKnownHostsFile=/dev/null and StrictHostKeyChecking=no, so they win.
        pins = ["-o", f'UserKnownHostsFile="{known}"', "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", f"HostKeyAlias={alias}"]  # fmt: skip
        prefix: list[str] = list(getattr(self, "ssh_prefix", []))
        if pins[1] not in prefix:
            self.ssh_prefix = pins + prefix
        return super()._start_own_master_once(timeout)
