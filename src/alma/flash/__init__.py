"""Flashing station: find Jetsons in recovery mode, verify and unpack a bundle once, run its
initrd-flash per board with time limits, watch the console, and record every attempt.

Everything that is not Python (the udev rules template) lives here as package data, so
the whole station is one install (docs/flash.md)."""


def require_station_deps() -> None:
    """The flashing station's Python packages (the ``flash`` extra) or a UserError saying how
    to install them: a build engineer's ``pip install -e .`` leaves them out."""
    import importlib.util

    from alma.errors import UserError

    wanted = (("pyudev", "pyudev"), ("serial", "pyserial"))
    missing = [dist for mod, dist in wanted if importlib.util.find_spec(mod) is None]
    if missing:
        raise UserError(
            f"the flashing station's packages are not installed: {', '.join(missing)} "
            "(USB discovery and the serial console need them)",
            hint=".venv/bin/pip install -e '.[flash]'  (libudev comes with systemd: sudo apt-get install libudev1)",
        )
