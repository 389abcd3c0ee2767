"""Flashing station: find Jetsons in recovery mode, verify and unpack a bundle once, run its
initrd-flash per board with time limits, watch the console, and record every attempt.

Everything that is not Python (the udev rules template) lives here as package data, so
the whole station is one install (docs/flash.md)."""
