"""Admin access for an image: which public keys go in, decided offline, before anything runs.

A release image (the default) has no password anywhere; the only way in is ssh with a key
for the admin user ``alma`` (layers/meta-alma/recipes-alma/alma-access). So a release build
without a key would make a board nobody can log into: the plan lists it as one of the
preflight problems (so a run stops with exit 2 together with every other problem, and
``--dry-run`` still shows the plan) unless the engineer asks for a sealed appliance
(``--no-admin-access``).

Where the keys come from, first match wins:
  1. ``alma build --admin-key FILE`` (repeatable)
  2. ``alma.toml``: ``[image] admin_keys = ["keys/ops.pub", ...]`` (paths, relative to the checkout)
  3. the build user's own key: ``~/.ssh/id_ed25519.pub``, then ``id_ecdsa.pub``, ``id_rsa.pub``
     (the plan says which one it took)

The keys reach bitbake as ``ALMA_ADMIN_KEYS`` in the generated ``alma-build.conf`` (public
keys: fine in a config file and a log). Each key is re-emitted from its parsed fields, so a
comment holding ``${...}``, quotes or a newline can never reach bitbake or a shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.errors import ConfigError, UserError
from alma.sshkeys import PublicKey, read_public_key_file

ADMIN_USER = "alma"
DEFAULT_KEY_NAMES = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")
KEY_SEPARATOR = ";"  # never inside a normalised key line (layer: alma-access.bbclass splits on it)
_RELEASE_LINE = re.compile(r'^\s*ALMA_RELEASE\s*(\?\?=|\?=|=|:=)\s*"([^"]*)"', re.MULTILINE)


@dataclass
class AdminAccess:
    release: bool
    sealed: bool = False
    keys: list[PublicKey] = field(default_factory=list)
    source: str = ""  # where the keys came from, for the plan
    problem: tuple[str, str] | None = None  # (what is wrong, the fix): a release without any key

    def conf_lines(self) -> list[str]:
        if self.sealed:
            return [
                "# --no-admin-access: a sealed appliance, no admin user and no login at all",
                'ALMA_ADMIN_ACCESS = "0"',
                'ALMA_ADMIN_KEYS = ""',
            ]
        if not self.keys:
            return []
        joined = KEY_SEPARATOR.join(k.line for k in self.keys)
        return [
            f"# admin access for user {ADMIN_USER}, keys only ({self.source})",
            'ALMA_ADMIN_ACCESS = "1"',
            f'ALMA_ADMIN_KEYS = "{joined}"',
        ]

    def note(self) -> str:
        if self.sealed:
            return "admin access: none (--no-admin-access): a sealed appliance nobody can log into"
        if self.problem is not None:
            return "admin access: no key found for this release image (listed with the problems below)"
        if not self.keys:
            return "admin access: no key (development build: debug-tweaks allow root login on the console)"
        prints = ", ".join(f"{k.type} {k.fingerprint}" for k in self.keys)
        return (
            f"admin access: ssh {ADMIN_USER}@<board> with {len(self.keys)} key(s) from {self.source}: {prints}"
            " (choose others with --admin-key FILE or [image] admin_keys in alma.toml)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "sealed": self.sealed,
            "user": None if self.sealed else ADMIN_USER,
            "source": self.source,
            "keys": [{"type": k.type, "fingerprint": k.fingerprint} for k in self.keys],
        }


def is_release(local_conf_header: dict[str, Any] | None) -> bool:
    """What ALMA_RELEASE the merged kas config leaves (kas writes the headers sorted by key;
    the last assignment wins; the distro's default is "1")."""
    value, hard = "1", False
    headers = local_conf_header or {}
    for key in sorted(headers):
        for m in _RELEASE_LINE.finditer(str(headers[key] or "")):
            if m.group(1) in ("=", ":="):
                value, hard = m.group(2), True
            elif not hard:  # ?= and ??= only fill a value nobody set
                value = m.group(2)
    return value == "1"


def _image_table(config: dict[str, Any]) -> dict[str, Any]:
    table = config.get("image", {})
    if not isinstance(table, dict):
        raise ConfigError("alma.toml: [image] must be a table", hint='[image]\nadmin_keys = ["keys/ops.pub"]')
    return table


def _configured_keys(table: dict[str, Any], root: Path) -> list[Path]:
    raw = table.get("admin_keys", [])
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise ConfigError(
            "alma.toml: [image] admin_keys must be a list of public key file paths",
            hint='admin_keys = ["~/.ssh/id_ed25519.pub", "keys/ops.pub"]',
        )
    paths = [Path(p).expanduser() for p in raw]
    return [p if p.is_absolute() else root / p for p in paths]


def resolve(
    *,
    release: bool,
    cli_keys: tuple[Path, ...],
    no_admin_access: bool,
    root: Path,
    config: dict[str, Any],
    home: Path | None = None,
) -> AdminAccess:
    """Decide the image's admin access. Raises UserError/ConfigError (exit 2) with the fix."""
    table = _image_table(config)
    sealed_cfg = table.get("admin_access", True)
    if not isinstance(sealed_cfg, bool):
        raise ConfigError("alma.toml: [image] admin_access must be true or false")
    sealed = no_admin_access or not sealed_cfg
    if sealed:
        if cli_keys:
            raise UserError(
                "--admin-key and --no-admin-access exclude each other",
                hint="drop --no-admin-access to bake the key in, or drop --admin-key for a sealed image",
            )
        return AdminAccess(release=release, sealed=True, source="--no-admin-access")
    if cli_keys:
        paths, source = list(cli_keys), "--admin-key"
    else:
        paths, source = _configured_keys(table, root), "alma.toml [image] admin_keys"
    if not paths:
        ssh_dir = (home or Path.home()) / ".ssh"
        found = next((ssh_dir / n for n in DEFAULT_KEY_NAMES if (ssh_dir / n).is_file()), None)
        if found is not None:
            paths, source = [found], f"the default {found} (your own key)"
    keys: list[PublicKey] = []
    for p in paths:
        key = read_public_key_file(Path(p))
        if all(k.blob_b64 != key.blob_b64 for k in keys):
            keys.append(key)
    acc = AdminAccess(release=release, keys=keys, source=source if keys else "")
    if release and not keys:
        # one of the plan's problems (listed with every preflight problem), not an early stop
        ssh_dir = (home or Path.home()) / ".ssh"
        acc.problem = (
            "a release image needs an admin key: it has no password anywhere, so without a key "
            f"nobody can ever log into the board (no {', '.join(DEFAULT_KEY_NAMES)} in {ssh_dir})",
            "alma build --admin-key ~/.ssh/id_ed25519.pub  (make one: ssh-keygen -t ed25519), "
            "or --no-admin-access for a sealed appliance",
        )
    return acc
