"""OpenSSH public keys, parsed once: admin keys baked into images, host keys pinned in the fleet.

A key is ``<type> <base64 blob> [comment]``: the blob's first field repeats the type (RFC 4253
section 6.6), so a pasted key with a wrong type or a truncated blob is caught here, not by sshd
on a board nobody can log into. The fingerprint is OpenSSH's ``SHA256:`` form (unpadded
base64 of the blob's sha256), the one ``ssh-keygen -l`` prints and a board shows on its console.

Threat model (docs/build.md, "Admin keys"): a key file given to ``alma build`` may be anything
(a private key, a binary, a huge file, a key with a shell or bitbake expression in its
comment). A private key is recognised from its first bytes and refused without reading the
rest; nothing of a refused file is echoed; a comment that is not plain text is dropped, so a
key line can sit in a bitbake variable and a shell script unquoted-safe.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from alma.errors import UserError

# The algorithms OpenSSH 9.6 (scarthgap's openssh) accepts for user and host keys.
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
MIN_RSA_BITS = 2048  # OpenSSH refuses shorter RSA keys since 8.x
MAX_KEY_FILE = 16 * 1024  # an RSA-16384 public key is ~2.8 KB; anything larger is not a key file
_COMMENT = re.compile(r"^[A-Za-z0-9@._+-]{1,64}$")
_B64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
FINGERPRINT = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")
# First bytes of every private-key container ssh-keygen, PuTTY or OpenSSL write.
_PRIVATE_MARKERS = (b"-----BEGIN", b"PuTTY-User-Key-File", b"openssh-key-v1")


class BadKey(UserError):
    """A key (file) that cannot be used; the message says why, never what it holds."""


@dataclass(frozen=True)
class PublicKey:
    type: str
    blob_b64: str
    comment: str = ""

    @property
    def line(self) -> str:
        """The key as one authorized_keys / known_hosts field set (comment only if plain)."""
        return f"{self.type} {self.blob_b64}" + (f" {self.comment}" if self.comment else "")

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(base64.b64decode(self.blob_b64)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _fields(blob: bytes) -> list[bytes]:
    """The blob's length-prefixed strings (RFC 4251 ``string``/``mpint``)."""
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise ValueError("truncated length")
        (n,) = struct.unpack(">I", blob[i : i + 4])
        i += 4
        if i + n > len(blob):
            raise ValueError("truncated field")
        out.append(blob[i : i + n])
        i += n
    return out


def parse_public_key(text: str, where: str = "key") -> PublicKey:
    """One public key line -> PublicKey, or BadKey saying what is wrong (not echoing it)."""
    parts = text.strip().split(None, 2)
    if len(parts) < 2:
        raise BadKey(f"{where}: not an OpenSSH public key (want '<type> <base64> [comment]')")
    ktype, b64 = parts[0], parts[1]
    if ktype not in KEY_TYPES:
        shown = ktype if re.fullmatch(r"[A-Za-z0-9@._-]{1,40}", ktype) else "?"
        raise BadKey(f"{where}: unsupported key type {shown!r}; use one of {', '.join(KEY_TYPES)}")
    if not _B64.fullmatch(b64):
        raise BadKey(f"{where}: the {ktype} key is not valid base64")
    try:
        blob = base64.b64decode(b64, validate=True)
        fields = _fields(blob)
    except (binascii.Error, ValueError):
        raise BadKey(f"{where}: the {ktype} key is truncated or corrupt") from None
    if not fields or fields[0] != ktype.encode():
        raise BadKey(f"{where}: the key says {ktype} but its data is another kind of key (corrupt paste?)")
    if ktype == "ssh-rsa":
        n = fields[2] if len(fields) >= 3 else b""
        bits = len(n.lstrip(b"\0")) * 8
        if bits < MIN_RSA_BITS:
            raise BadKey(f"{where}: RSA key of {bits} bits; OpenSSH needs at least {MIN_RSA_BITS}")
    elif ktype == "ssh-ed25519" and (len(fields) != 2 or len(fields[1]) != 32):
        raise BadKey(f"{where}: the ssh-ed25519 key has the wrong length")
    comment = parts[2].strip() if len(parts) > 2 else ""
    return PublicKey(ktype, b64, comment if _COMMENT.fullmatch(comment) else "")


def read_public_key_file(path: Path) -> PublicKey:
    """The one key in ``path``. Private keys are recognised from their first bytes and
    refused before anything else is read; the file's content is never put in a message."""
    try:
        with path.open("rb") as fh:
            head = fh.read(32)
            if head.lstrip().startswith(_PRIVATE_MARKERS):
                pub = path.with_name(path.name + ".pub")
                fix = f"pass the public half: {pub}" if pub.exists() else "pass the .pub file (ssh-keygen -y -f KEY)"
                raise BadKey(f"{path}: this is a PRIVATE key; it was not read further and is never copied", hint=fix)
            rest = fh.read(MAX_KEY_FILE)
    except FileNotFoundError:
        raise BadKey(f"{path}: no such file", hint="ssh-keygen -t ed25519 makes ~/.ssh/id_ed25519.pub") from None
    except IsADirectoryError:
        raise BadKey(f"{path}: is a directory, not a public key file") from None
    except OSError as exc:
        raise BadKey(f"{path}: cannot read: {exc.strerror}") from None
    data = head + rest
    if len(data) > MAX_KEY_FILE:
        raise BadKey(f"{path}: {len(data)}+ bytes is too large for a public key file")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise BadKey(f"{path}: not a text file (binary data), not an OpenSSH public key") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise BadKey(f"{path}: holds {len(lines)} key lines; give one key per --admin-key")
    return parse_public_key(lines[0], str(path))


def parse_host_key(value: str, where: str = "host_key") -> str:
    """A pinned host key: a full public key (normalised, comment dropped) or a SHA256 fingerprint."""
    v = value.strip()
    if FINGERPRINT.fullmatch(v):
        return v
    if v.startswith("SHA256:"):
        raise BadKey(f"{where}: a SHA256 fingerprint is 'SHA256:' and 43 base64 characters")
    key = parse_public_key(v, where)
    return f"{key.type} {key.blob_b64}"
