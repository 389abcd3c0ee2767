"""The guard tools' error: the board library's ConfigError (exit 2 for alma-guard and
alma-fabric, UNKNOWN 3 for alma-health), printed with its hint, never a traceback."""

from __future__ import annotations

from almaboard.errors import ConfigError


class GuardError(ConfigError):
    """A user or configuration error; the CLI prints it with its hint and exits non-zero."""
