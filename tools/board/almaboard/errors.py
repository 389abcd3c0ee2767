"""The one exception hierarchy of host and board: ``alma.errors`` builds on these classes
(its ``AlmaError`` is :class:`BoardError`), so both sides raise and catch the same errors.

Code below a program's ``main`` raises these and never calls ``sys.exit``; :func:`run_main`
maps them to exit codes. Every user-facing error carries a ``hint`` naming the next step.
Programs with their own code conventions subclass and set ``exit_code`` (ERAN-GRID: 3
privacy refusal, 4 coordinator unreachable; alma-health: UNKNOWN 3 for usage errors).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class BoardError(Exception):
    """Base of every error a program (on the board or ``alma`` on the host) raises on purpose. Exit 1."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UserError(BoardError):
    """Bad arguments, bad config or a missing precondition the user can fix. Exit 2."""

    exit_code = 2


class ConfigError(UserError):
    """A configuration file is malformed or inconsistent (the message names ``file:line``)."""


INTERRUPTED = 130


def report(prog: str, exc: BoardError) -> None:
    """``prog: error: message`` and a ``try:`` line on stderr (never a traceback)."""
    print(f"{prog}: error: {exc.message}", file=sys.stderr)
    if exc.hint:
        hint = exc.hint[len("try:") :].strip() if exc.hint.startswith("try:") else exc.hint
        print(f"  try: {hint}", file=sys.stderr)


def silence_stdout() -> None:
    """After a BrokenPipeError (``prog ... | head``): not an error; stop the interpreter's
    final flush from raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run_main(prog: str, body: Callable[[], int], *, error_code: int | None = None) -> int:
    """Run a program's body and map what escapes it to an exit code.

    :class:`BoardError` → its ``exit_code`` (or ``error_code`` when the program has one
    code for every refusal, as a Nagios plugin's UNKNOWN), Ctrl-C → 130, a closed stdout
    pipe → 0 (the reader went away; the verdict stands). Anything else is a bug and keeps
    its traceback (exit 1).
    """
    try:
        return int(body())
    except BoardError as exc:
        report(prog, exc)
        return exc.exit_code if error_code is None else error_code
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return 0
