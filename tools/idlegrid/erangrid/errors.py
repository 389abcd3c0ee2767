"""The agent's errors: the board library's hierarchy (almaboard.errors, the on-board twin of
alma.errors) with ERAN-GRID's own exit codes."""

from __future__ import annotations

from almaboard.errors import BoardError, UserError

GridError = BoardError  # the base: every error the agent raises on purpose


class NotOptedIn(UserError):
    """The config does not say ``enabled = true``."""


class PrivacyViolation(BoardError):
    """The agent holds (or was asked to hold) a camera, microphone or input device."""

    exit_code = 3


class CoordinatorUnreachable(BoardError):
    """The queue (SQLite file or NATS server) cannot be reached: wait, never simulate."""

    exit_code = 4


__all__ = ["CoordinatorUnreachable", "GridError", "NotOptedIn", "PrivacyViolation", "UserError"]
