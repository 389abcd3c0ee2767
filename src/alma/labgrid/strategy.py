"""``AlmaStrategy``: off → recovery → flashed → booted → shell, each on evidence.

- off: the power driver switches the board off.
- recovery: recovery line held through a power cycle; reached only when the board shows up
  on USB in recovery mode (the ``AlmaRecoveryBoard`` resource becomes available) within
  ``recovery_timeout``.
- flashed: ``AlmaFlashDriver`` flashed the env's bundle; the record says SUCCESS.
- booted: that record's boot watch saw the login prompt on the console (the resource needs
  ``console:``); the console's identity line gave the board's name, addresses and host key.
- shell: ``AlmaSSHDriver`` logged in with that host key pinned and ran a command.

Each failure raises with the record's reason; labgrid marks the strategy broken (never_retry).
"""

from __future__ import annotations

import enum
from typing import Any

import attr
from almaboard.text import terminal
from labgrid.exceptions import NoResourceFoundError
from labgrid.factory import target_factory
from labgrid.step import step
from labgrid.strategy.common import Strategy, StrategyError, never_retry

from alma.flash.records import FlashRecord


class Status(enum.Enum):
    unknown = 0
    off = 1
    recovery = 2
    flashed = 3
    booted = 4
    shell = 5


@target_factory.reg_driver
@attr.s(eq=False)
class AlmaStrategy(Strategy):
    bindings = {
        "power": "AlmaRecoveryDriver",
        "board": {"AlmaRecoveryBoard", "NetworkAlmaRecoveryBoard"},
        "flasher": "AlmaFlashDriver",
        "shell": {"AlmaSSHDriver", None},
    }

    status = attr.ib(default=Status.unknown)
    recovery_timeout = attr.ib(default=30.0, converter=float)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.record: FlashRecord | None = None

    def _off(self) -> None:
        if self.shell is not None:
            self.target.deactivate(self.shell)
        self.target.activate(self.power)
        self.power.off()

    def _recovery(self) -> None:
        self.target.activate(self.power)
        self.power.enter_recovery()
        try:
            self.target.await_resources([self.board], timeout=self.recovery_timeout)
        except NoResourceFoundError:
            where = getattr(self.board, "usb_path", None) or "its USB port"
            raise StrategyError(
                f"the board did not appear in recovery mode at USB {where} within {self.recovery_timeout:.0f} s "
                "(power, recovery line, cable?)"
            ) from None

    def _flashed(self) -> None:
        self.target.activate(self.flasher)
        self.record = self.flasher.flash()

    def _booted(self) -> dict[str, Any]:
        rec = self.record
        assert rec is not None
        if rec.boot is None:
            raise StrategyError("booted: the flash watched no console; give the AlmaRecoveryBoard a console:")
        if not rec.boot.seen:
            raise StrategyError(
                f"booted: no login prompt on {terminal(str(rec.boot.console))}: {terminal(str(rec.boot.reason))}"
            )
        if not rec.boot.board:
            raise StrategyError("booted: the console showed no alma-board identity line (name, address, host key)")
        return rec.boot.board

    @never_retry
    @step(args=["status"])
    def transition(self, status: Status | str, *, step: Any) -> None:
        if not isinstance(status, Status):
            status = Status[status]
        if status == Status.unknown:
            raise StrategyError(f"can not transition to {status}")
        if status == self.status:
            step.skip("nothing to do")
            return
        if status == Status.off:
            self._off()
        elif status == Status.recovery:
            self._recovery()
        elif status == Status.flashed:
            self.transition(Status.recovery)
            self._flashed()
        elif status == Status.booted:
            if self.status != Status.flashed:
                self.transition(Status.flashed)
            self._booted()
        elif status == Status.shell:
            if self.shell is None:
                raise StrategyError("shell: no AlmaSSHDriver in this target")
            if self.status != Status.booted:
                self.transition(Status.booted)
            ident = self._booted()
            self.shell.host_key = ident["hostkey"]
            self.target.activate(self.shell)
            self.shell.run_check("true")
        self.status = status
