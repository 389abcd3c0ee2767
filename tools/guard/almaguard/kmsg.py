"""The kernel log since a saved cursor, from /dev/kmsg (or a file in the same format).

/dev/kmsg hands out one record per read(): ``PRIO,SEQ,TS_USEC,FLAGS;message`` followed by
optional `` KEY=value`` continuation lines; EAGAIN at the end (opened non-blocking), EPIPE
when the record was overwritten while reading. A regular file with those lines (a test's
fake tree) reads the same way. The cursor is (boot id, last sequence number).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    seq: int
    ts_usec: int
    prio: int
    text: str


def parse_line(line: str) -> Record | None:
    head, sep, text = line.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 3:
        return None
    try:
        return Record(seq=int(parts[1]), ts_usec=int(parts[2]), prio=int(parts[0]) & 7, text=text.rstrip("\n"))
    except ValueError:
        return None


def _fast(line: str, needles: tuple[str, ...]) -> Record | None:
    """Parse only the sequence number unless the text holds a needle (the common case)."""
    if not needles or any(n in line for n in needles):
        return parse_line(line)
    head, sep, _text = line.partition(";")
    parts = head.split(",", 3)
    if not sep or len(parts) < 3 or not parts[1].isdigit():
        return None
    return Record(seq=int(parts[1]), ts_usec=0, prio=0, text="")


def read_records(path: Path, needles: tuple[str, ...] = ()) -> Iterator[Record]:
    """Every record available now; PermissionError propagates (needs CAP_SYSLOG or root).

    Records without any of ``needles`` come back with empty text (only the sequence number
    is parsed); no needles: every record in full."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        import stat

        if stat.S_ISCHR(os.fstat(fd).st_mode):
            while True:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    return
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        continue  # records overwritten under us: carry on with the next
                    raise
                if not chunk:
                    return
                rec = _fast(chunk.decode("utf-8", "replace").split("\n", 1)[0], needles)
                if rec:
                    yield rec
        else:
            # A regular file (a fake tree, a saved log) can be any size: stream it line by
            # line in bounded memory (the old whole-file read took 458 MB for 173 MB). Lines
            # without a needle only move the cursor, and only the newest one is parsed.
            pat = re.compile("|".join(map(re.escape, needles))) if needles else None
            last: str | None = None
            last_wanted = False
            with os.fdopen(os.dup(fd), "r", encoding="utf-8", errors="replace", newline="\n") as fh:
                for line in fh:
                    if not line or line[0] == " " or line == "\n":
                        continue  # dictionary continuation lines start with a space
                    last = line
                    last_wanted = pat is None or bool(pat.search(line))
                    if last_wanted:
                        rec = parse_line(line)
                        if rec:
                            yield rec
            if last is not None and not last_wanted:
                rec = _fast(last, ())
                if rec:
                    yield Record(rec.seq, rec.ts_usec, rec.prio, "")  # only moves the cursor
    finally:
        os.close(fd)


def since(path: Path, cursor_seq: int | None, needles: tuple[str, ...] = ()) -> tuple[list[Record], int | None]:
    """Records newer than ``cursor_seq`` (all when None) and the new cursor.

    With ``needles``, only records containing one of them are returned (the cursor still
    covers every record): a full ring buffer is ~5000 records and most are not wanted.
    """
    out: list[Record] = []
    last = cursor_seq
    for rec in read_records(path, needles):
        if last is None or rec.seq > last:
            last = rec.seq
        if (cursor_seq is None or rec.seq > cursor_seq) and rec.text:
            out.append(rec)
    return out, last
