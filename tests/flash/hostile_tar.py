"""Raw tar bytes, header by header, for hostile flash bundles (a tar writer would
refuse to write most of them). Used by tests/flash/test_headers.py, the agreement test and
bench/bench_flash_hostile.py.

Each ``KINDS`` entry builds the tar (uncompressed) of one attack; ``gz`` compresses it.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable

BLOCK = 512
END = b"\0" * (2 * BLOCK)
ENV = b'MACHINE="jetson-orin-nano-devkit"\nCHIPID="0x23"\n'


def pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def header(
    name: bytes,
    size: int = 0,
    kind: bytes = b"0",
    *,
    linkname: bytes = b"",
    size_field: bytes | None = None,
    magic: bytes = b"ustar\x0000",
    tail: Callable[[bytearray], None] | None = None,
    checksum_delta: int = 0,
) -> bytes:
    h = bytearray(BLOCK)
    h[0 : len(name[:100])] = name[:100]
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"14710000000\0"
    h[156:157] = kind
    h[157 : 157 + len(linkname[:100])] = linkname[:100]
    h[257:265] = magic
    if tail is not None:
        tail(h)
    h[148:156] = b"        "
    h[148:156] = b"%06o\0 " % (sum(h) + checksum_delta)
    return bytes(h)


def member(name: bytes, data: bytes) -> bytes:
    return header(name, len(data)) + pad(data)


def pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n += 1
    return str(n).encode() + body


def pax(records: bytes, kind: bytes = b"x") -> bytes:
    return header(b"././@PaxHeader", len(records), kind) + pad(records)


def bundle(*middle: bytes) -> bytes:
    """An env file, the hostile part, a file after it, the end blocks."""
    return member(b".env.initrd-flash", ENV) + b"".join(middle) + member(b"initrd-flash", b"#!/bin/sh\n") + END


def gz(tar: bytes) -> bytes:
    return gzip.compress(tar, compresslevel=6, mtime=0)


def _sparse_entries(pairs: list[tuple[int, int]]) -> bytes:
    return b"".join(b"%011o\0%011o\0" % p for p in pairs)


def old_gnu_sparse(
    name: bytes,
    pairs: list[tuple[int, int]],
    realsize: int,
    ext_blocks: list[bytes] = (),  # type: ignore[assignment]
    stored: int | None = None,
    real_field: bytes | None = None,
) -> bytes:
    """An old-GNU 'S' header (4 map entries in the header, more in extension blocks)."""
    data_len = stored if stored is not None else sum(n for _, n in pairs)

    def tail(h: bytearray) -> None:
        h[386 : 386 + 96] = _sparse_entries(pairs[:4]).ljust(96, b"\0")
        h[482] = 1 if ext_blocks else 0
        h[483:495] = (real_field if real_field is not None else b"%011o\0" % realsize).ljust(12, b"\0")

    return header(name, data_len, b"S", magic=b"ustar  \0", tail=tail) + b"".join(ext_blocks)


def ext_block(pairs: list[tuple[int, int]], more: bool) -> bytes:
    b = bytearray(BLOCK)
    b[0:504] = _sparse_entries(pairs[:21]).ljust(504, b"\0")
    b[504] = 1 if more else 0
    return bytes(b)


# --- the hostile kinds ---------------------------------------------------------------


def pax_redos() -> bytes:
    """CVE-2024-6232: a pax header of digits (and hdrcharset= without its newline) on which
    tarfile's `\\d+ hdrcharset=` search is quadratic (3.11 < 3.11.10, 3.12 < 3.12.6)."""
    return bundle(pax(b"0" * 65536 + b"1 hdrcharset=" * 2000))


def pax_redos_small() -> bytes:
    """The issue's 2.6 KB shape."""
    return bundle(pax(b"1 hdrcharset=" * 100 + b"0" * 1300))


def sparse_flood(blocks: int = 120_000) -> bytes:
    """Old-GNU sparse map in ~60 MB of extension blocks (tarfile reads them all, 512 bytes at a time)."""
    ext = ext_block([(1, 0)] * 21, True)
    last = ext_block([(1, 0)], False)
    return bundle(old_gnu_sparse(b"rootfs.img", [(0, 0)] * 4, 1 << 30, [ext] * (blocks - 1) + [last]))


def pax01_map_flood() -> bytes:
    value = b",".join([b"0,0"] * 600_000)
    return bundle(pax(pax_record(b"GNU.sparse.size", b"1") + pax_record(b"GNU.sparse.map", value)), header(b"img", 0))


def pax10_map_flood() -> bytes:
    lines = b"400000\n" + b"0\n0\n" * 400_000
    recs = (
        pax_record(b"GNU.sparse.major", b"1")
        + pax_record(b"GNU.sparse.minor", b"0")
        + pax_record(b"GNU.sparse.name", b"img")
        + pax_record(b"GNU.sparse.realsize", b"1")
    )
    data = pad(lines)
    return bundle(pax(recs), header(b"GNUSparseFile.0/img", len(data)) + data)


def sparse_bad_number() -> bytes:
    return bundle(old_gnu_sparse(b"img", [(0, 4)], 4, real_field=b"zz\0"))


def sparse_truncated_map() -> bytes:
    """isextended=1 and the archive ends inside the map."""
    tar = member(b".env.initrd-flash", ENV) + old_gnu_sparse(b"img", [(0, 4)], 4, [ext_block([(8, 4)], True)])
    return tar


def pax01_bad_map() -> bytes:
    recs = pax_record(b"GNU.sparse.size", b"8") + pax_record(b"GNU.sparse.map", b"0,x")
    return bundle(pax(recs), header(b"img", 4) + pad(b"abcd"))


def pax_sparse_size_not_a_number() -> bytes:
    """GNU.sparse.size without a map (GNU tar 1.34: "Malformed extended header: invalid GNU.sparse.size")."""
    return bundle(pax(pax_record(b"GNU.sparse.size", b"12x")), header(b"img", 4) + pad(b"abcd"))


def sparse_map_larger_than_data() -> bytes:
    """The map says 1 MiB of data, the archive stores 4 bytes."""
    return bundle(old_gnu_sparse(b"img", [(0, 1 << 20)], 1 << 20, stored=4) + pad(b"abcd"))


def corrupt_header_midway() -> bytes:
    """A member whose header checksum is wrong, between two good ones (tarfile took it as the end)."""
    return bundle(member(b"a", b"1"), header(b"b", 1, checksum_delta=7) + pad(b"2"), member(b"c", b"3"))


def metadata_flood() -> bytes:
    """17 pax headers of 1 MiB each: each under the per-header cap, together over the archive budget."""
    parts = []
    for i in range(17):
        parts.append(pax(pax_record(b"comment", b"c" * ((1 << 20) - 32))) + header(b"x%d" % i, 0))
    return bundle(*parts)


def pax_global_key_flood(headers: int = 300, members: int = 2000) -> bytes:
    """Global pax headers of 1000 distinct keys each, then many members: each header is under
    the per-header key cap, together 300,000 keys that every later member carried (the reader
    copied them per member: a 2.4 MB bundle took over 10 minutes and 245 MB)."""
    parts = [
        pax(b"".join(pax_record(b"k%d.%d" % (g, i), b"v") for i in range(1000)), kind=b"g") for g in range(headers)
    ]
    return bundle(*parts, *(member(b"f%d" % i, b"") for i in range(members)))


def symlink_power(levels: int = 12) -> bytes:
    """``a0 -> .``, ``a1 -> a0/a0/...`` (33 times), ``a2 -> a1/a1/...``: every link stays inside
    the bundle, but resolving ``a12`` by expanding each name again visits 33**12 names."""
    links = [header(b"a0", 0, b"2", linkname=b".")]
    for i in range(1, levels + 1):
        links.append(header(b"a%d" % i, 0, b"2", linkname=b"/".join([b"a%d" % (i - 1)] * 40)[:98]))
    return bundle(*links)


def implied_dir_flood(members: int = 20_000) -> bytes:
    """Empty files 60 directories deep under distinct top dirs (ustar prefix + name): each
    member implies 60 new directories, which the checker kept as names without counting
    them (0.1 MB: 1.2 million names, 266 MB; 1.1 MB would have been ~2.6 GB)."""

    def one(i: int) -> bytes:
        prefix = (b"t%06d/" % i) + b"/".join([b"dd"] * 48)

        def tail(h: bytearray) -> None:
            h[345 : 345 + len(prefix)] = prefix

        return header(b"/".join([b"ee"] * 11) + b"/f", 0, tail=tail)

    return bundle(*(one(i) for i in range(members)))


KINDS: dict[str, Callable[[], bytes]] = {
    "pax-redos": pax_redos,
    "pax-redos-2.6k": pax_redos_small,
    "old-gnu-sparse-flood": sparse_flood,
    "pax-0.1-map-flood": pax01_map_flood,
    "pax-1.0-map-flood": pax10_map_flood,
    "sparse-bad-number": sparse_bad_number,
    "sparse-truncated-map": sparse_truncated_map,
    "pax-0.1-bad-map": pax01_bad_map,
    "pax-sparse-size-not-a-number": pax_sparse_size_not_a_number,
    "sparse-map-larger-than-data": sparse_map_larger_than_data,
    "corrupt-header-midway": corrupt_header_midway,
    "metadata-flood": metadata_flood,
    "pax-global-key-flood": pax_global_key_flood,
}
