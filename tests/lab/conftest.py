"""Fixtures of the virtual-board tier."""

from support_lab import lab_board  # noqa: F401 - a fixture, used by name
