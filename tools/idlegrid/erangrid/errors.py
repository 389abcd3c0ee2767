"""The agent's one exception hierarchy (the on-board twin of alma.errors: stdlib only)."""

from __future__ import annotations


class GridError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with; ``hint`` is a "try: ..." line."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class UserError(GridError):
    """Bad configuration or arguments: the user can fix it."""

    exit_code = 2


class NotOptedIn(UserError):
    """The config does not say ``enabled = true``."""


class PrivacyViolation(GridError):
    """The agent holds (or was asked to hold) a camera, microphone or input device."""

    exit_code = 3


class CoordinatorUnreachable(GridError):
    """The queue (SQLite file or NATS server) cannot be reached: wait, never simulate."""

    exit_code = 4
