"""udev rules so a member of ``plugdev`` can flash without running everything as root.

The template is package data (``alma/flash/data/70-alma-jetson.rules.j2``): one rule per
recovery-mode product id from the PID table, plus initrd-flash's 1d6b:0104 gadget.
"""

from __future__ import annotations

import grp
import os
import re
import shlex
from importlib import resources
from pathlib import Path

import jinja2
from almaboard.text import terminal

from alma import runner, settings
from alma.errors import ToolError, UserError
from alma.flash.pids import GADGET_PRODUCT, GADGET_VENDOR, MODULES, NVIDIA_VENDOR
from alma.ground import write_atomic

RULES_NAME = "70-alma-jetson.rules"
DEFAULT_RULES_DIR = Path("/etc/udev/rules.d")
GROUP = "plugdev"


# POSIX's portable user/group name characters (no leading '-'), at most 32 like shadow's useradd
_GROUP_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,31}\Z")


def check_group(group: str) -> str:
    """``group`` is a portable group name that exists here: it is written into 13 rules that
    udev applies as root at every plug-in, so nothing else may pass (quotes, newlines, RUN+=)."""
    shown = shlex.quote(terminal(group[:64]))
    if not _GROUP_NAME.match(group):
        raise UserError(
            f"--group {shown}: not a group name (POSIX portable: letters, digits, '.', '_', '-', not first; "
            "at most 32)",
            hint="alma setup udev --group plugdev",
        )
    try:
        grp.getgrnam(group)
    except KeyError:
        raise UserError(
            f"--group {shown}: no such group on this host", hint=f"sudo groupadd {shlex.quote(group)}"
        ) from None
    return group


def render(group: str = GROUP) -> str:
    check_group(group)
    text = resources.files("alma.flash").joinpath("data", RULES_NAME + ".j2").read_text(encoding="utf-8")
    tmpl = jinja2.Template(text, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    modules = sorted(MODULES.values(), key=lambda m: m.pid)
    return tmpl.render(
        vendor=NVIDIA_VENDOR,
        modules=modules,
        gadget_vendor=GADGET_VENDOR,
        gadget_product=GADGET_PRODUCT,
        group=group,
    )


def install(rules_dir: Path | None = None, group: str = GROUP) -> Path:
    """Write the rules atomically; returns the path."""
    directory = Path(rules_dir or os.environ.get("ALMA_UDEV_RULES_DIR") or DEFAULT_RULES_DIR)
    path = directory / RULES_NAME
    try:
        write_atomic(path, render(group))
        os.chmod(path, 0o644)
    except PermissionError as exc:
        raise UserError(
            f"cannot write {path}: permission denied",
            hint="sudo alma setup udev   (or: alma setup udev --print | sudo tee " + str(path) + ")",
        ) from exc
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}", hint="check --rules-dir") from exc
    return path


def reload_udev() -> None:
    """``udevadm control --reload`` then ``udevadm trigger`` through the runner."""
    udevadm = settings.tool("udevadm")
    try:
        runner.run([udevadm, "control", "--reload"], timeout=30)
        runner.run([udevadm, "trigger", "--subsystem-match=usb", "--action=add"], timeout=60)
    except ToolError as exc:
        raise ToolError(
            f"{exc.message} (the rules file is written; only the reload failed)",
            returncode=exc.returncode,
            hint="is systemd-udevd running? then: sudo udevadm control --reload && sudo udevadm trigger",
        ) from exc
