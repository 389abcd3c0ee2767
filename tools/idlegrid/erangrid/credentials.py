"""The queue's credentials: in a file only the agent can read, never in the configuration.

``/etc/eran-grid/eran-grid.toml`` is world-readable (every user runs ``eran-grid status``), and
a job runs as a uid of its own on the same board: a password in ``queue.url`` let a job connect
as the agent and publish forged results. So a URL with ``user:password@`` is refused, and the
secret lives in ``/etc/eran-grid/queue-credentials`` (root, 0600), which systemd hands to the
agent's dynamic user with ``LoadCredential=queue:...`` as ``$CREDENTIALS_DIRECTORY/queue``
(a read-only copy only the unit's user can read). Root running an admin verb reads the file
itself. Whatever is read here never reaches a message: every URL shown goes through
:func:`redact`.

File format (one line): ``user:password``, or a token (no ``:``), or a NATS ``.creds`` file
(``-----BEGIN NATS USER JWT-----``), passed to the client by path.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .errors import NoAccess, UserError

DEFAULT_FILE = Path("/etc/eran-grid/queue-credentials")
CREDENTIAL_ID = "queue"  # the unit's LoadCredential= id
MAX_BYTES = 64 * 1024

# scheme://userinfo@host: the userinfo part of any URL in a text (several may be listed, comma-separated)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s,]*@")


def redact(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by ``***``."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def url_has_userinfo(url: str) -> bool:
    return any("@" in (urlsplit(u.strip()).netloc or "") for u in url.split(","))


@dataclass(frozen=True)
class QueueCredentials:
    source: str  # the file they came from (shown in messages; never the secret)
    user: str = ""
    password: str = ""
    token: str = ""
    creds_file: str = ""  # a NATS .creds file, passed by path


def _parse(text: str, source: str) -> QueueCredentials | None:
    if "BEGIN NATS USER JWT" in text:
        return QueueCredentials(source, creds_file=source)
    line = text.strip()
    if not line:
        return None  # the shipped file is empty: no credentials (a server without auth)
    if "\n" in line:
        raise UserError(f"{source}: one line expected (user:password, or a token)")
    user, sep, password = line.partition(":")
    if sep:
        if not user or not password:
            raise UserError(f"{source}: user:password with an empty part")
        return QueueCredentials(source, user=user, password=password)
    return QueueCredentials(source, token=line)


def load(configured: Path | None = DEFAULT_FILE, env: Mapping[str, str] | None = None) -> QueueCredentials | None:
    """The credentials systemd loaded for the unit, else the configured file, else None.

    The configured file must be readable by its owner only: a secret any user (a job) can read
    is no secret, so a group- or world-readable file is refused, not used. A file this user may
    not read is an error naming the file and what to run instead."""
    cred_dir = (os.environ if env is None else env).get("CREDENTIALS_DIRECTORY", "")
    if cred_dir and os.path.isfile(os.path.join(cred_dir, CREDENTIAL_ID)):
        path = Path(cred_dir) / CREDENTIAL_ID
    elif configured is not None and configured.exists():
        path = configured
        try:
            st = path.stat()
        except OSError as exc:
            raise UserError(f"cannot read the queue credentials {path}: {exc.strerror}") from None
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise UserError(
                f"{path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}): refusing to use "
                "queue credentials any job could read",
                hint=f"chmod 0600 {path}",
            )
    else:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except PermissionError:
        raise NoAccess(
            f"cannot read the queue credentials {path}: only root and the agent may",
            hint="run this as root (sudo eran-grid ...)",
        ) from None
    except OSError as exc:
        raise UserError(f"cannot read the queue credentials {path}: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{path}: larger than {MAX_BYTES} bytes; not a credentials file")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    return _parse(text, str(path))


__all__ = ["DEFAULT_FILE", "QueueCredentials", "load", "redact", "url_has_userinfo"]
