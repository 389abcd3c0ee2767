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


class NoAccess(BoardError):
    """This user may not open the queue (its files are the agent's, 0700 under DynamicUser;
    the credentials are root's): the error says what to run instead. The queue is out of
    reach for this user, so the same code as an unreachable coordinator."""

    exit_code = 4


__all__ = ["CoordinatorUnreachable", "GridError", "NoAccess", "NotOptedIn", "PrivacyViolation", "UserError"]
