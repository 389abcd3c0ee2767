"""The one error type of the on-board tools: a message and a next step, never a traceback."""

from __future__ import annotations


class GuardError(Exception):
    """A user or configuration error; the CLI prints it with its hint and exits non-zero."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
