"""One exception hierarchy (the same shape as almaboard.errors): a message, a hint, an exit code.

A copy kept on purpose, not an import of almaboard.errors: ERANCLOUD ships as its own package
(pyproject and recipe eran-cloud depend on numpy and nats-py, not on the board library), runs
on volunteers' desktops where almaboard is not installed, and is started as a job by
eran-grid from its own directory. Keep the shape (message, ``hint``, ``exit_code``) the same.
"""

from __future__ import annotations


class CloudError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with; ``hint`` is a "try: ..." line."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UserError(CloudError):
    """Bad arguments or configuration: the user can fix it."""

    exit_code = 2


class RegistrationRefused(CloudError):
    """The coordinator answered and said no (the reply carries the reason)."""

    exit_code = 3


class CoordinatorUnreachable(CloudError):
    """No NATS server, no JetStream, or no coordinator answering: fail closed, never simulate."""

    exit_code = 4


class IntegrityError(CloudError):
    """A model, shard or delta whose hash or contents do not match what the coordinator published."""

    exit_code = 5


class BadBlob(ValueError):
    """A blob (model, delta, momentum, shard) that does not decode: the reason is the message.
    Not a CloudError: callers decide whether it is an integrity failure or a rejected push."""


EX_TEMPFAIL = 75  # vacated by SIGTERM with a checkpoint saved: "resume me" (ERAN-GRID's contract)
