"""One exception hierarchy for the whole toolchain, and the exit codes it maps to.

Code below the CLI raises these and never calls ``sys.exit``; ``alma.cli.main`` maps
them to exit codes. Every user-facing error carries a ``hint`` ("try: ...") naming the
next step, so the user never has to read a traceback.

Exit codes: what each means by default. A verb may add its own (flash 3/4/5, boards --wait 124,
fleet inspect 3, fleet health's Nagios codes); docs/cli.md, "Exit codes", lists every
command's set, generated from its help and checked against the code:
"""

from __future__ import annotations

# The base, user and config errors are the board library's (almaboard.errors): one hierarchy
# for host and board, so a value refused by almaboard.fields on the host is the same
# ConfigError (exit 2) that every `except ConfigError` here catches. AlmaError: base of
# every error the toolchain raises on purpose, exit 1.
from almaboard.errors import BoardError as AlmaError
from almaboard.errors import ConfigError, UserError

EXIT_OK = 0  # the verb did what was asked and the verdict is positive
EXIT_NEGATIVE = 1  # the verdict is negative: stale gate doc, lint findings, failed build/flash
EXIT_USAGE = 2  # usage or precondition error: bad option, bad input file, host not ready (with the fix)
EXIT_INTERNAL = 70  # a bug in alma (EX_SOFTWARE): traceback kept in a log file, its path printed
EXIT_INTERRUPTED = 130  # Ctrl-C: work stopped cleanly (128 + SIGINT)


class PreflightError(UserError):
    """The host is not ready for the requested work (tools, disk, RAM, network, root)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        lines = [f"{what}  (fix: {fix})" for what, fix in problems]
        super().__init__(
            "preflight failed:\n  " + "\n  ".join(lines),
            hint="fix the items above, then run the same command again",
        )
        self.problems = problems


class ToolError(AlmaError):
    """An external tool (kas, bitbake, initrd-flash, ssh, ...) failed: a negative verdict, exit 1.

    ``returncode`` is the tool's own exit code. It is reported (in the message, the log and
    --json), never passed through as alma's: kas's 2 is not alma's "usage error".
    """

    def __init__(
        self,
        message: str,
        *,
        returncode: int | None = None,
        hint: str | None = None,
        log_path: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.returncode = returncode
        self.log_path = log_path


class ToolNotFound(UserError):
    """An external program is not installed or not on PATH."""


class ToolTimeout(ToolError):
    """An external tool ran past its (phase) deadline and was stopped."""


class ToolOutputLimit(ToolError):
    """An external tool printed more than the caller's output cap and was stopped."""


class Interrupted(AlmaError):
    """The user pressed Ctrl-C; work was stopped cleanly. Exit 130."""

    exit_code = EXIT_INTERRUPTED


__all__ = [
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_NEGATIVE",
    "EXIT_OK",
    "EXIT_USAGE",
    "AlmaError",
    "ConfigError",
    "Interrupted",
    "PreflightError",
    "ToolError",
    "ToolNotFound",
    "ToolOutputLimit",
    "ToolTimeout",
    "UserError",
]
