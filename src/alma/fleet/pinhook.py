"""ssh's ``KnownHostsCommand`` for a node with a pinned host key (stdlib only, run with -I).

ssh runs it with the pinned SHA256 fingerprint, the node's alias (``%H``), and the key the
server offered on THIS connection (``%t %K``), however it was reached (ProxyCommand,
ProxyJump, a bastion). It prints a known_hosts line for that key only when its fingerprint
is the pinned one; otherwise it prints nothing, so ssh refuses the host ("Host key
verification failed"), and it says on stderr which key was pinned and which was offered.
ssh also calls it once before the key is known (``%K`` is ``NONE``): it prints nothing then.

Usage: python3 -I pinhook.py SHA256:<pinned> <alias> <key type> <base64 key>
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sys

PREFIX = "alma: host key mismatch"


def fingerprint(b64: str) -> str | None:
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("alma pinhook: usage: SHA256:<pinned> <alias> <type> <key>", file=sys.stderr)
        return 2
    pinned, alias, ktype, key = argv
    if key == "NONE":  # ssh is only choosing its host key algorithms: no key offered yet
        return 0
    seen = fingerprint(key)
    if seen is not None and seen == pinned:
        print(f"{alias} {ktype} {key}")
        return 0
    print(f"{PREFIX} for {alias}: pinned {pinned}, the host offered {ktype} {seen or '(unreadable key)'} "
          "(a reflashed board has a new key: update its host_key in the fleet file; otherwise suspect "
          "a man in the middle)", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
