r"""The one parser of a bundle's ``.env.initrd-flash`` (written by meta-tegra's
``image_types_tegra.bbclass``, ``create_tegraflash_pkg``).

The real ``initrd-flash`` sources it with bash, as root; we never execute it, but we read it
the way bash does, so what alma checks is what the script runs with:

- lines end at ``\n`` only (bash's reading; never ``str.splitlines``, which also splits at
  ``\r \x0b \x0c \x1c-\x1e \x85 \u2028``); the text must be UTF-8;
- any other control character anywhere (C0, DEL, C1, line/paragraph separators) is refused;
- every line is blank, a ``#`` comment, or one plain assignment ``KEY=WORD`` /
  ``DEFAULTS[KEY]=WORD`` whose WORD is one shell word with nothing bash would expand or
  run: ``"..."`` without ``$ ` \``, ``'...'``, or unquoted ``[A-Za-z0-9_.,:/+@%=-]``
  characters, in any sequence. A space outside quotes would make the rest a command
  (``ROOTFS_DEVICE=mmcblk0 touch x`` runs ``touch`` as root): refused, as are ``;``, ``|``,
  ``$(...)``, globs, ``~`` and a key set twice;
- values are at most ``VALUE_MAX`` bytes and every message quotes at most ``QUOTE_MAX``
  characters of the line, sanitized.

``alma verify`` and ``alma flash`` both read it here, so they can never read one file two ways.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from almaboard.text import terminal

from alma.errors import UserError
from alma.tegraflash.names import is_machine

ENV_NAME = ".env.initrd-flash"
ENV_MAX = 64 * 1024  # the real file is under 1 KiB; refuse anything absurd
_HINT = "rebuild the bundle (bitbake writes this file)"


@dataclass
class FlashEnv:
    values: dict[str, str]
    defaults: dict[str, str] = field(default_factory=dict)
    path: Path | None = None

    def get(self, key: str, default: str = "") -> str:
        return self.values.get(key, default)

    @property
    def machine(self) -> str:
        return self.values["MACHINE"]

    @property
    def chipid(self) -> str:
        return self.values.get("CHIPID", "").lower()

    @property
    def rootfs_device(self) -> str:
        return self.values.get("ROOTFS_DEVICE", "")

    @property
    def bootdev(self) -> str:
        return self.values.get("BOOTDEV", "")

    def payload_files(self) -> list[str]:
        """Bundle files the flash only reads (the rootfs image, the data partition image)."""
        return [v for v in (self.get("ROOTFS_IMAGE"), self.get("DATAFILE")) if v and "/" not in v]

    def flat(self) -> dict[str, str]:
        """``KEY`` and ``DEFAULTS[KEY]`` in one dict (the facts manifest's view)."""
        return {**self.values, **{f"DEFAULTS[{k}]": v for k, v in self.defaults.items()}}


VALUE_MAX = 1024  # meta-tegra's longest values (ODMDATA, EMMC_BCTS) are well under 200 bytes
QUOTE_MAX = 200
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[A-Za-z0-9_]+\])?\Z")
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.,:/+@%=-")
_NOT_IN_DOUBLE = frozenset('$`\\"')


def _quote(text: str) -> str:
    """A bounded, sanitized quote of bundle text for a message."""
    short = text[:QUOTE_MAX] + ("..." if len(text) > QUOTE_MAX else "")
    return repr(terminal(short))


def _word(rhs: str) -> str | None:
    """The value of one shell word made only of quoting bash does not expand, else None.

    One pass over the text (linear; no regular expression backtracks on bundle text).
    """
    out: list[str] = []
    i, n = 0, len(rhs)
    while i < n:
        c = rhs[i]
        if c == "'":
            j = rhs.find("'", i + 1)
            if j < 0:
                return None
            out.append(rhs[i + 1 : j])
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n and rhs[j] not in _NOT_IN_DOUBLE:
                j += 1
            if j >= n or rhs[j] != '"':
                return None  # unterminated, or $ ` \ inside: bash would expand it
            out.append(rhs[i + 1 : j])
            i = j + 1
        elif c in _BARE:
            out.append(c)
            i += 1
        else:
            return None
    return "".join(out)


def parse_env(text: str, path: Path | str | None = None) -> FlashEnv:
    values: dict[str, str] = {}
    defaults: dict[str, str] = {}
    where = str(path or ENV_NAME)
    for n, raw in enumerate(text.split("\n"), 1):  # bash ends lines at \n only
        bad = next((c for c in raw if not c.isprintable()), None)
        if bad is not None:
            raise UserError(
                f"{where}:{n}: control character U+{ord(bad):04X} in {_quote(raw)}: bash and alma would read "
                "this line differently; refused",
                hint=_HINT,
            )
        line = raw.strip(" ")
        if not line or line.startswith("#"):
            continue
        key, eq, rhs = line.partition("=")
        if not eq or not _KEY.match(key):
            raise UserError(f"{where}:{n}: not a KEY=value line: {_quote(raw)}", hint=_HINT)
        value = _word(rhs)
        if value is None:
            raise UserError(
                f"{where}:{n}: {key}'s value {_quote(rhs)} is not one plain shell word (bash would expand it or "
                "run part of it as a command when initrd-flash sources this file); refused",
                hint=_HINT,
            )
        if len(value.encode()) > VALUE_MAX:
            raise UserError(
                f"{where}:{n}: {key}'s value is {len(value.encode())} bytes (at most {VALUE_MAX}); refused", hint=_HINT
            )
        sub = key[9:-1] if key.startswith("DEFAULTS[") else None
        target, name = (defaults, sub) if sub is not None else (values, key)
        if "[" in key and sub is None:
            raise UserError(f"{where}:{n}: {_quote(key)}: only DEFAULTS[...] may be indexed", hint=_HINT)
        if name in target:
            raise UserError(f"{where}:{n}: {key} is set twice; refused", hint=_HINT)
        target[name] = value
    if not values.get("MACHINE"):
        raise UserError(f"{where}: no MACHINE", hint="rebuild the bundle with IMAGE_TEGRAFLASH_INITRD_FLASHER set")
    if not is_machine(values["MACHINE"]):
        # the bundle's words never choose a path: MACHINE names the flash record
        raise UserError(
            f"{where}: MACHINE={_quote(values['MACHINE'])} is not a meta-tegra machine name "
            "(lower-case letters, digits, '-' and '_'); refused",
            hint=_HINT,
        )
    return FlashEnv(values, defaults, Path(path) if path else None)


def decode_env(data: bytes, path: Path | str | None = None) -> FlashEnv:
    if len(data) > ENV_MAX:
        raise UserError(f"{path or ENV_NAME}: {len(data)} bytes, not a small env file", hint=_HINT)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path or ENV_NAME}: not UTF-8 at byte {exc.start}: bash and alma would read it differently; refused",
            hint=_HINT,
        ) from None
    return parse_env(text, path)


def read_env(bundle_dir: Path) -> FlashEnv:
    path = bundle_dir / ENV_NAME
    if not path.is_file():
        raise UserError(
            f"the bundle has no {ENV_NAME}: not an initrd-flash bundle",
            hint="build it with meta-tegra scarthgap (Orin bundles carry initrd-flash); doflash.sh bundles "
            "are not supported by alma flash",
        )
    return decode_env(path.read_bytes(), path)
