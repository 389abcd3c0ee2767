"""The one tar header reader: ustar, GNU (long names, long links, old-GNU sparse with its
extension blocks), pax (incl. ``hdrcharset`` and the 0.0 / 0.1 / 1.0 sparse formats), parsed
here rather than by the interpreter's ``tarfile`` so the limits hold on every Python the
station runs (CPython 3.11.2 .. 3.11.9 and 3.12.0 .. 3.12.5 carry the quadratic pax regex,
CVE-2024-6232; their sparse readers allocate maps without bound).

Invariants (tests/flash/test_headers.py attacks each):

1. Bounded work: every header byte is looked at a constant number of times (no regular
   expression ever sees archive text; pax records are split with ``bytes.find`` from a known
   offset), and the metadata of the whole archive (pax/GNU extension data, sparse maps)
   is at most ``HEADER_BUDGET`` (16 MiB), a single sparse map at most ``MAP_BUDGET`` (1 MiB);
   the global pax keys and one member's own keys are each at most ``MAX_PAX_KEYS`` over all
   their headers, and a member sees the global ones through a view, never a copy.
   The caller's stream checks the cancel flag on every inflated piece, so a signal is
   honoured within one piece (4 MiB) of parsing.
2. Every malformed header is :class:`MalformedHeader` (a :class:`CorruptBundle`, exit 2 with
   a REFUSED record): a checksum mismatch anywhere (a corrupt header mid-archive is *not*
   taken as the end, as GNU tar reports it), non-numeric or negative numbers, truncated
   extension data or maps, a sparse map out of order, past the file's size, or whose
   segments do not add up to the data stored, an end without the end-of-archive block.
3. What a header says is only data: names and link targets are returned as text for
   :class:`~alma.tegraflash.members.MemberChecker` to judge; nothing here touches a path.
"""

from __future__ import annotations

import tarfile
from collections import ChainMap
from collections.abc import Iterator, Mapping
from typing import Protocol

from alma.tegraflash.stream import CorruptBundle

BLOCK = 512
HEADER_BUDGET = 16 << 20  # metadata bytes over the whole archive
MAP_BUDGET = 1 << 20  # bytes of one sparse map (old-GNU extension blocks, pax map text or data)
MAX_SPARSE = MAP_BUDGET // 24  # segments in one map (an old-GNU entry is 24 bytes)
MAX_PAX_KEYS = 1024  # distinct keys of one member's pax headers, and of the global ones (POSIX defines a dozen)
_NUMERIC_MAX_DIGITS = 20  # a pax record length / a sparse number: 2**64 has 20 digits

_OCTAL = b"01234567"
_DECIMAL = b"0123456789"
_OCTAL_FIELD = b"01234567\0 "
# Header types (POSIX ustar + GNU). Anything else is refused by the member checker as unsupported.
_EXT_TYPES = {b"L", b"K", b"x", b"g", b"X"}
_REG = b"0"


class Stream(Protocol):
    pos: int

    def read(self, n: int = -1) -> bytes: ...

    def seek(self, target: int, whence: int = 0) -> int: ...


class MalformedHeader(CorruptBundle):
    """A tar header that no honest ``tar`` wrote. Exit 2 (a REFUSED record), never a crash."""


def _bad(why: str, offset: int) -> MalformedHeader:
    return MalformedHeader(f"malformed tar header at byte {offset}: {why}")


def _number(field: bytes, what: str, offset: int) -> int:
    """An octal field (NUL/space padded) or GNU base-256 (first byte 0x80/0xff)."""
    if field and field[0] in (0x80, 0xFF):
        n = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            n -= 1 << (8 * (len(field) - 1))
        return n
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    if digits.translate(None, _OCTAL):  # anything left is not an octal digit (C speed, no regex)
        raise _bad(f"{what} is not a number ({digits[:24]!r})", offset)
    return int(digits, 8)


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _checksum_ok(block: bytes) -> bool:
    stored = block[148:156].split(b"\0", 1)[0].strip(b" ")
    if not stored or stored.translate(None, _OCTAL):
        return False
    want = int(stored, 8)
    unsigned = sum(block[:148]) + 8 * 0x20 + sum(block[156:])
    if want == unsigned:
        return True
    signed = sum((c - 256 if c > 127 else c) for c in block[:148] + block[156:]) + 8 * 0x20
    return want == signed  # some old tars summed signed chars (tarfile and GNU tar accept both)


def _decimal(raw: bytes, what: str, offset: int) -> int:
    raw = raw.strip()
    if not raw or len(raw) > _NUMERIC_MAX_DIGITS or raw.translate(None, _DECIMAL):
        raise _bad(f"{what} is not a decimal number ({raw[:24]!r})", offset)
    return int(raw)


def parse_pax(data: bytes, offset: int) -> dict[str, str]:
    """``"%d %s=%s\\n"`` records, linear: each record's length is read, then checked.

    Repeated ``GNU.sparse.offset``/``GNU.sparse.numbytes`` records (pax sparse 0.0) are
    joined, in order, into one ``GNU.sparse.map`` value (the 0.1 form).
    """
    out: dict[str, str] = {}
    pos = 0
    pairs: list[str] = []
    while pos < len(data):
        if data[pos] == 0:  # padding after the last record
            if data[pos:].strip(b"\0"):
                raise _bad("pax header: data after its NUL padding", offset)
            break
        space = data.find(b" ", pos, pos + _NUMERIC_MAX_DIGITS + 1)
        if space < 0:
            raise _bad("pax header: a record without its length", offset)
        length = _decimal(data[pos:space], "pax record length", offset)
        end = pos + length
        if length < 5 or end > len(data) or data[end - 1] != 0x0A:
            raise _bad("pax header: a record length that does not match its record", offset)
        eq = data.find(b"=", space + 1, end)
        if eq < 0:
            raise _bad("pax header: a record without '='", offset)
        # hdrcharset=BINARY (POSIX): values are raw bytes; either way they are kept as
        # surrogate-escaped text, so the member checker sees exactly what a tar would write.
        key = data[space + 1 : eq].decode("utf-8", "surrogateescape")
        value = data[eq + 1 : end - 1].decode("utf-8", "surrogateescape")
        if key in ("GNU.sparse.offset", "GNU.sparse.numbytes"):
            if len(pairs) >= 2 * MAX_SPARSE:
                raise _bad(f"pax sparse 0.0 map: more than {MAX_SPARSE} segments", offset)
            pairs.append(value)
        else:
            out[key] = value
            if len(out) > MAX_PAX_KEYS:
                raise _bad(f"pax header: more than {MAX_PAX_KEYS} keys", offset)
        pos = end
    if pairs and "GNU.sparse.map" not in out:
        out["GNU.sparse.map"] = ",".join(pairs)
    return out


class _Budget:
    def __init__(self) -> None:
        self.used = 0

    def take(self, n: int, offset: int) -> None:
        self.used += n
        if self.used > HEADER_BUDGET:
            raise _bad(f"more than {HEADER_BUDGET >> 20} MiB of tar metadata", offset)


def _padded(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def _read_exact(stream: Stream, n: int, what: str, offset: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise _bad(f"{what} ends early (the archive is truncated)", offset)
    return data


def _check_map(segments: list[tuple[int, int]], realsize: int, stored: int, name: str, offset: int) -> None:
    """In order, inside the file, and adding up to the data the archive stores."""
    end = 0
    total = 0
    for off, n in segments:
        if off < end or n < 0:
            raise _bad(f"sparse map of {name!r}: segments overlap or run backwards", offset)
        end = off + n
        total += n
    if end > realsize:
        raise _bad(f"sparse map of {name!r}: a segment ends past the file's size ({end} > {realsize})", offset)
    if total != stored:
        raise _bad(f"sparse map of {name!r}: its segments hold {total} bytes, the archive stores {stored}", offset)


def _old_gnu_map(block: bytes, stream: Stream, budget: _Budget, offset: int) -> list[tuple[int, int]]:
    segments: list[tuple[int, int]] = []

    def entries(raw: bytes, count: int) -> None:
        raw = raw[: count * 24]
        if raw.translate(None, _OCTAL_FIELD):  # base-256 or junk: the general, slower path
            for i in range(0, len(raw), 24):
                ent = raw[i : i + 24]
                if ent.strip(b"\0"):
                    segments.append(
                        (_number(ent[:12], "sparse offset", offset), _number(ent[12:], "sparse size", offset))
                    )
            return
        try:  # octal digits, NUL and space only: int() per field (C speed; a map is up to 43690 entries)
            for i in range(0, len(raw), 24):
                off = raw[i : i + 12].split(b"\0", 1)[0].strip()
                size = raw[i + 12 : i + 24].split(b"\0", 1)[0].strip()
                if off or size:
                    segments.append((int(off or b"0", 8), int(size or b"0", 8)))
        except ValueError:
            raise _bad("an old-GNU sparse entry is not a number", offset) from None

    entries(block[386:482], 4)
    extended = block[482]
    used = 0
    while extended:
        used += BLOCK
        if used > MAP_BUDGET:
            raise _bad(f"an old-GNU sparse map over {MAP_BUDGET >> 20} MiB", offset)
        budget.take(BLOCK, offset)
        ext = _read_exact(stream, BLOCK, "old-GNU sparse extension block", offset)
        entries(ext[:504], 21)
        extended = ext[504]
    return segments


def _pax_map_text(text: str, offset: int) -> list[tuple[int, int]]:
    if len(text) > MAP_BUDGET:
        raise _bad(f"a pax sparse map over {MAP_BUDGET >> 20} MiB", offset)
    parts = text.split(",") if text else []
    if len(parts) % 2:
        raise _bad("pax sparse map: an odd number of values", offset)
    nums = [_decimal(p.encode(), "pax sparse map value", offset) for p in parts]
    return list(zip(nums[::2], nums[1::2], strict=True))


def _pax10_map(stream: Stream, stored: int, budget: _Budget, offset: int) -> tuple[list[tuple[int, int]], int]:
    """The 1.0 map at the start of the data: decimal lines (count, then offset/size pairs),
    padded to a block. Returns the map and its length in bytes."""
    buf = b""
    pos = 0

    def line() -> int:
        nonlocal buf, pos
        while True:
            nl = buf.find(b"\n", pos, pos + _NUMERIC_MAX_DIGITS + 1)
            if nl >= 0:
                value = _decimal(buf[pos:nl], "pax 1.0 sparse map value", offset)
                pos = nl + 1
                return value
            if len(buf) - pos > _NUMERIC_MAX_DIGITS:
                raise _bad("pax 1.0 sparse map: a number without its newline", offset)
            if len(buf) + BLOCK > MAP_BUDGET or len(buf) + BLOCK > stored:
                raise _bad(f"pax 1.0 sparse map over {MAP_BUDGET >> 20} MiB or past its member", offset)
            budget.take(BLOCK, offset)
            buf += _read_exact(stream, BLOCK, "pax 1.0 sparse map", offset)

    count = line()
    if count > MAX_SPARSE:
        raise _bad(f"pax 1.0 sparse map: {count} segments (at most {MAX_SPARSE})", offset)
    segments = [(line(), line()) for _ in range(count)]
    return segments, len(buf)


def headers(stream: Stream) -> Iterator[tarfile.TarInfo]:
    """The archive's members as ``TarInfo`` (name, type, size = apparent size, mode, mtime,
    linkname, ``sparse`` (offset, size) list or None, ``offset_data``), in order.

    The caller may read a member's data (from ``offset_data``) before asking for the next
    header; the reader then skips forward to it.
    """
    budget = _Budget()
    global_pax: dict[str, str] = {}
    next_at = 0
    while True:
        if stream.pos < next_at:
            stream.seek(next_at)
        elif stream.pos > next_at:
            raise _bad("a member's data was read past its end", next_at)
        offset = stream.pos
        # This member's own pax keys win over the global ones (as in tarfile); a view, never a
        # copy: copying the global keys per member made 2.4 MB of 'g' headers cost minutes.
        local: dict[str, str] = {}
        pax: ChainMap[str, str] = ChainMap(local, global_pax)
        long_name: str | None = None
        long_link: str | None = None
        while True:
            block = stream.read(BLOCK)
            if len(block) < BLOCK:
                if not block and offset == 0:
                    raise CorruptBundle("empty archive: not a tar")
                raise _bad("the archive ends without its end-of-archive block (truncated)", stream.pos)
            if not block.strip(b"\0"):
                if long_name is not None or long_link is not None or local:
                    raise _bad("an extended header without the member it describes", offset)
                return  # end of archive (GNU tar stops at the first zero block too)
            if not _checksum_ok(block):
                raise _bad("header checksum mismatch (GNU tar: 'Skipping to next header')", stream.pos - BLOCK)
            here = stream.pos - BLOCK
            kind = block[156:157]
            size = _number(block[124:136], "size", here)
            if size < 0:
                raise _bad(f"negative size {size}", here)
            if kind not in _EXT_TYPES:
                break
            if size > HEADER_BUDGET:
                raise _bad(f"an extended header of {size} bytes", here)
            budget.take(_padded(size), here)
            data = _read_exact(stream, _padded(size), "extended header data", here)[:size]
            if kind == b"L":
                long_name = _text(data)
            elif kind == b"K":
                long_link = _text(data)
            else:
                keys = global_pax if kind == b"g" else local
                keys.update(parse_pax(data, here))
                if len(keys) > MAX_PAX_KEYS:  # over several headers too: each is bounded alone
                    raise _bad(f"pax headers with more than {MAX_PAX_KEYS} keys", here)
        ti, next_at = _member(block, kind, size, pax, long_name, long_link, stream, budget, here)
        yield ti


def _member(
    block: bytes,
    kind: bytes,
    size: int,
    pax: Mapping[str, str],
    long_name: str | None,
    long_link: str | None,
    stream: Stream,
    budget: _Budget,
    here: int,
) -> tuple[tarfile.TarInfo, int]:
    """The member and where the next header starts."""
    name = _text(block[0:100])
    magic = block[257:263]
    if magic in (b"ustar\x00", b"ustar ") and block[345:346] != b"\0" and kind != b"S":
        prefix = _text(block[345:500])
        if prefix and magic == b"ustar\x00":
            name = prefix + "/" + name
    if long_name is not None:
        name = long_name
    linkname = long_link if long_link is not None else _text(block[157:257])
    ti = tarfile.TarInfo()
    ti.mode = _number(block[100:108], "mode", here)
    ti.uid = 0
    ti.gid = 0
    ti.mtime = _number(block[136:148], "mtime", here)
    ti.type = kind if kind != b"\0" else _REG
    ti.sparse = None
    stored = size if kind in (b"0", b"\0", b"7", b"S") else 0
    apparent = size
    sparse: list[tuple[int, int]] | None = None
    if kind == b"S":
        sparse = _old_gnu_map(block, stream, budget, here)
        if len(sparse) > MAX_SPARSE:
            raise _bad("old-GNU sparse map: too many segments", here)
        apparent = _number(block[483:495], "sparse real size", here)
        ti.type = _REG
    data_area = stream.pos  # after old-GNU extension blocks; the 1.0 map is inside the data
    if "path" in pax:
        name = pax["path"]
    if "linkpath" in pax:
        linkname = pax["linkpath"]
    if "size" in pax:
        apparent = stored = _decimal(pax["size"].encode("utf-8", "surrogateescape"), "pax size", here)
        if kind not in (b"0", b"\0", b"7"):
            stored = 0
    if "mtime" in pax:
        whole = pax["mtime"].split(".", 1)[0]
        negative = whole.startswith("-")
        ti.mtime = 0 if negative else _decimal(whole.encode("utf-8", "surrogateescape"), "pax mtime", here)
    offset_data = data_area
    for key in _SPARSE_NUMBERS.intersection(pax):  # every one present, map or not (as GNU tar)
        _decimal(pax[key].encode("utf-8", "surrogateescape"), key, here)
    if "GNU.sparse.major" in pax or "GNU.sparse.map" in pax:
        if kind not in (b"0", b"\0", b"7"):
            raise _bad(f"pax sparse records on a member of type {kind!r}", here)
        sparse, apparent, name = _pax_sparse(pax, name, stream, stored, budget, here)
        offset_data = stream.pos
        stored_data = stored - (offset_data - data_area)
        ti.type = _REG
    else:
        stored_data = stored
    if sparse is not None:
        _check_map(sparse, apparent, stored_data, name, here)
    ti.name = name.rstrip("/") if ti.type == tarfile.DIRTYPE and name != "/" else name
    ti.linkname = linkname
    ti.size = apparent
    ti.sparse = sparse  # type: ignore[assignment]  # typeshed says bytes; tarfile stores (offset, size) pairs
    ti.offset = here
    ti.offset_data = offset_data
    ti.pax_headers = {}
    return ti, data_area + _padded(stored)


# GNU tar refuses any of these that is not a number ("Malformed extended header: invalid GNU.sparse.size").
_SPARSE_NUMBERS = frozenset(
    {"GNU.sparse.size", "GNU.sparse.realsize", "GNU.sparse.major", "GNU.sparse.minor", "GNU.sparse.numblocks"}
)


def _pax_sparse(
    pax: Mapping[str, str], name: str, stream: Stream, stored: int, budget: _Budget, here: int
) -> tuple[list[tuple[int, int]], int, str]:
    real = pax.get("GNU.sparse.realsize", pax.get("GNU.sparse.size"))
    if real is None:
        raise _bad("pax sparse member without GNU.sparse.realsize/size", here)
    apparent = _decimal(real.encode("utf-8", "surrogateescape"), "GNU.sparse.realsize", here)
    name = pax.get("GNU.sparse.name", name)
    major, minor = pax.get("GNU.sparse.major"), pax.get("GNU.sparse.minor")
    if major is not None:
        if (major, minor) != ("1", "0"):
            raise _bad(f"pax sparse format {major}.{minor} (known: 0.0, 0.1, 1.0)", here)
        segments, _ = _pax10_map(stream, stored, budget, here)
        return segments, apparent, name
    # 0.1, and 0.0 (its repeated offset/numbytes records were joined by parse_pax)
    text = pax.get("GNU.sparse.map", "")
    budget.take(len(text), here)
    return _pax_map_text(text, here), apparent, name
