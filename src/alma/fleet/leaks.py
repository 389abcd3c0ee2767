"""The leak scanner: IP addresses (in any numeric spelling) and internal names in a text.

Every public file the panel writes passes it; what it finds is refused (:class:`LeakError`),
never published.
"""

from __future__ import annotations

import ipaddress
import re

from alma.errors import UserError

# A sentence may end right after an address ("down at 10.0.0.1."): only a digit, or a dot
# followed by a digit, continues a number. Parts may be written with leading zeros, in
# octal (0377) or hex (0xff): inet_aton reads all of them as addresses, so the scan does.
_PART = r"(?:0[xX][0-9a-fA-F]{1,8}|\d{1,12})"
_IPV4_CAND = re.compile(rf"(?<![\w.])(?<!\d\.){_PART}(?:\.{_PART}){{3}}(?![\w]|\.\d)")
_IPV6_CAND = re.compile(r"(?<![0-9A-Za-z:])[0-9A-Fa-f:]*:[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*(?![0-9A-Za-z:])")


class LeakError(UserError):
    """The page would publish something private; nothing was written."""


def _octet(part: str) -> bool:
    """Could ``part`` be one byte of an address, read as decimal, octal or hex?"""
    if part[:2].lower() == "0x":
        return int(part, 16) <= 255
    values = [int(part, 10)]
    if len(part) > 1 and part.startswith("0") and all(c in "01234567" for c in part):
        values.append(int(part, 8))
    return any(v <= 255 for v in values)


def find_ips(text: str) -> list[str]:
    """IPv4 and IPv6 addresses in ``text`` (candidates validated by ``ipaddress``).

    IPv4 numbers are normalised first: ``010.020.030.040`` and ``0x0a.0.0.1`` are addresses.
    """
    found = []
    for m in _IPV4_CAND.finditer(text):
        if all(_octet(p) for p in m.group(0).split(".")):
            found.append(m.group(0))
    for m in _IPV6_CAND.finditer(text):
        cand = m.group(0).rstrip(".")
        try:
            ipaddress.IPv6Address(cand)
            found.append(cand)
        except ValueError:
            pass
    return found



_TOKEN = re.compile(r"[\w.-]+")
_NAME_CHARS = re.compile(r"^[\w.-]+$")


class LeakScanner:
    r"""IP addresses and internal names in a text: ONE linear pass, whatever the fleet size.

    A name counts where it stands alone: not inside a longer word, though a trailing dot
    (a sentence's end, or a domain: ``edge-01.lab``) still counts. The text is cut into
    ``[\w.-]+`` tokens once; the token and every prefix of it that ends before a dot
    (``edge-01``, ``edge-01.lab``) are looked up in a set. The rare name with other
    characters is matched by one regex. The sets and the regex are built once per render
    (building them per scanned text made 1000 node pages quadratic: 1000 x 3000 names).
    """

    def __init__(self, forbidden: set[str]) -> None:
        self.plain = {n.lower() for n in forbidden if _NAME_CHARS.match(n)}
        other = sorted(n for n in forbidden if not _NAME_CHARS.match(n))
        alternation = "|".join(re.escape(n) for n in sorted(other, key=len, reverse=True))
        self.other = re.compile(rf"(?<![\w.-])(?:{alternation})(?![\w-])", re.IGNORECASE) if other else None
        self.by_lower = {n.lower(): n for n in forbidden}

    def __call__(self, html: str) -> list[str]:
        out = [f"IP address {ip}" for ip in find_ips(html)]
        found: set[str] = set()
        plain = self.plain
        for tok in set(_TOKEN.findall(html.lower())):  # each distinct token once (C speed for the scan)
            if tok in plain:
                found.add(tok)
            cut = tok.find(".")
            while cut != -1:  # a name ends where the token does or at a dot (never before \w or -)
                if tok[:cut] in plain:
                    found.add(tok[:cut])
                cut = tok.find(".", cut + 1)
        if self.other is not None:
            found.update(m.group(0).lower() for m in self.other.finditer(html))
        return out + [f"internal name {self.by_lower.get(n, n)!r}" for n in sorted(found)]


def leaks(html: str, forbidden: set[str]) -> list[str]:
    """IP addresses and internal names in ``html`` (:class:`LeakScanner`, built for one text)."""
    return LeakScanner(forbidden)(html)
