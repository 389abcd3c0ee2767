"""Parse bitbake's non-TTY output (as ``kas shell -c "bitbake ..."`` passes it back) live.

The formats are bitbake 2.8's (scarthgap), from lib/bb/ui/knotty.py, lib/bb/runqueue.py and
oe-core's sstate.bbclass:

    NOTE: Running setscene task 12 of 645 (/…/quilt-native_0.67.bb:do_populate_sysroot_setscene)
    NOTE: Running task 1201 of 3011 (/…/busybox_1.36.1.bb:do_compile)
    NOTE: Running noexec task 7 of 3011 (/…/packagegroup-core-boot.bb:do_build)
    Sstate summary: Wanted 2210 Local 1800 Mirrors 0 Missed 410 Current 391 (81% match, 85% complete)
    NOTE: Tasks Summary: Attempted 3011 tasks of which 2188 didn't need to be rerun and 1 failed.
    NOTE: Tasks Summary: Attempted 3011 tasks of which 2188 didn't need to be rerun and all succeeded.
    ERROR: busybox-1.36.1-r0 do_compile: oe_runmake failed
    ERROR: Logfile of failure stored in: /…/temp/log.do_compile.4242
    ERROR: Task (/…/busybox_1.36.1.bb:do_compile) failed with exit code '1'
    Summary: 1 task failed:
      /…/busybox_1.36.1.bb:do_compile
        log: /…/temp/log.do_compile.4242
    Summary: There were 2 ERROR messages, returning a non-zero exit code.
    Execution was interrupted, returning a non-zero exit code.

Speed matters (a full build prints ~500k lines): ``feed`` dispatches on the first character
and ``str.startswith`` before any regex, so an uninteresting line costs a few hundred ns.
``scan_stream`` serves pipes: it copies blocks to a log and hands ``feed`` only the lines a
single multiline regex found interesting.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing and dataclasses cost start-up time in `python -m alma.imagebuild.progress`
    from typing import IO, Any

_RUNNING = re.compile(r"NOTE: Running (setscene task|noexec task|task) (\d+) of (\d+) \((.*)\)$")
_SSTATE = re.compile(
    r"Sstate summary: Wanted (\d+) Local (\d+) Mirrors (\d+) Missed (\d+) Current (\d+) "
    r"\((\d+)% match, (\d+)% complete\)"
)
_TASKS_SUMMARY = re.compile(
    r"NOTE: Tasks Summary: Attempted (\d+) tasks of which (\d+) didn't need to be rerun and "
    r"(?:(\d+) failed|all succeeded)\."
)
_TASK_ERROR = re.compile(r"ERROR: (\S+) (do_\w+): (.*)$")
_TASK_FAILED = re.compile(r"ERROR: Task \((.*)\) failed with exit code '(-?\d+)'")
_FAILED_HEAD = re.compile(r"Summary: (\d+) tasks? failed:")
_COUNT = re.compile(r"Summary: There (?:was|were) (\d+) (ERROR|WARNING) messages?")
_PARSED = re.compile(r"Parsing of (\d+) \.bb files complete")

_LOGFILE = "ERROR: Logfile of failure stored in: "
_MAX_ERRORS_KEPT = 50

# Lines scan_stream hands to feed(): everything feed() dispatches on except the (many)
# "NOTE: Running [setscene] task" lines, which scan_stream counts and samples per block.
# Anchored on the newline so the regex engine's literal-prefix search skips through a block.
RARE = re.compile(
    rb"\n(?:NOTE: Tasks Summary|NOTE: Executing Tasks|Sstate summary|Summary: |ERROR: |"
    rb"Execution was interrupted|Parsing of |  \S|    log: )[^\n]*"
)
_B_RUNNING = b"\nNOTE: Running "
_B_SETSCENE = b"\nNOTE: Running setscene"


class TaskStarted:
    __slots__ = ("kind", "number", "tid", "total")

    def __init__(self, kind: str, number: int, total: int, tid: str) -> None:
        self.kind = kind  # "task", "noexec", "setscene"
        self.number = number
        self.total = total
        self.tid = tid  # bitbake's task id: "<recipe file>:do_<task>"


class Phase:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name  # "parsed", "executing"


class Failure:
    __slots__ = ("log", "tid")

    def __init__(self, tid: str, log: str | None) -> None:
        self.tid = tid
        self.log = log


class Stats:
    """Everything learned from the output so far; ``summary()`` is the end-of-build view."""

    def __init__(self) -> None:
        self.task_number = 0
        self.task_total = 0
        self.tasks_started = 0
        self.setscene_number = 0
        self.setscene_total = 0
        self.setscene_started = 0
        self.current = ""
        self.recipes_parsed: int | None = None
        self.sstate: dict[str, int] | None = None
        self.attempted: int | None = None
        self.reused: int | None = None
        self.failed_count: int | None = None
        self.failures: dict[str, str | None] = {}  # tid -> log path
        self.task_errors: list[str] = []
        self.error_messages: int | None = None
        self.warning_messages: int | None = None
        self.interrupted = False
        self.lines = 0

    def summary(self) -> dict[str, Any]:
        run = None if self.attempted is None or self.reused is None else self.attempted - self.reused
        return {
            "tasks_total": self.task_total,
            "tasks_attempted": self.attempted,
            "tasks_run": run if run is not None else self.tasks_started,
            "tasks_reused": self.reused,
            "setscene_total": self.setscene_total,
            "setscene_run": self.setscene_started,
            "sstate": self.sstate,
            "failed_tasks": [{"task": tid, "log": log} for tid, log in self.failures.items()],
            "errors": self.error_messages,
            "warnings": self.warning_messages,
            "interrupted": self.interrupted,
            "recipes_parsed": self.recipes_parsed,
        }


def short_task(tid: str) -> str:
    """``/…/busybox_1.36.1.bb:do_compile`` -> ``busybox_1.36.1:do_compile`` (multiconfig/virtual kept)."""
    fn, _, task = tid.rpartition(":")
    head, _, base = fn.rpartition("/")
    prefix = head.rsplit(":", 1)[0] + ":" if head.startswith(("mc:", "virtual:")) and ":" in head else ""
    return f"{prefix}{base.removesuffix('.bb')}:{task}" if fn else tid


class BitbakeParser:
    """Feed it bitbake's output one line at a time; it keeps ``stats`` and returns events."""

    __slots__ = ("_in_failed_list", "_last_failed", "_pending_log_for", "stats")

    def __init__(self) -> None:
        self.stats = Stats()
        self._in_failed_list = False
        self._last_failed: str | None = None
        self._pending_log_for: str | None = None  # task title awaiting its "Logfile of failure"

    def feed(self, line: str) -> TaskStarted | Phase | Failure | None:
        st = self.stats
        st.lines += 1
        c = line[:1]
        if c == " ":
            if self._in_failed_list:
                return self._failed_list_item(line)
            return None
        self._in_failed_list = False
        if c == "N":
            if line.startswith("NOTE: Running "):
                m = _RUNNING.match(line)
                if m is None:
                    return None
                kind, num, total, tid = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
                if kind == "setscene task":
                    st.setscene_number, st.setscene_total = num, total
                    st.setscene_started += 1
                    ev = TaskStarted("setscene", num, total, tid)
                else:
                    st.task_number, st.task_total = num, total
                    st.tasks_started += 1
                    ev = TaskStarted("noexec" if kind == "noexec task" else "task", num, total, tid)
                st.current = tid
                return ev
            if line.startswith("NOTE: Tasks Summary: "):
                m = _TASKS_SUMMARY.match(line)
                if m:
                    st.attempted, st.reused = int(m.group(1)), int(m.group(2))
                    st.failed_count = int(m.group(3)) if m.group(3) else 0
                return None
            if line.startswith("NOTE: Executing Tasks"):
                return Phase("executing")
            return None
        if c == "S":
            if line.startswith("Sstate summary: "):
                m = _SSTATE.match(line)
                if m:
                    keys = ("wanted", "local", "mirrors", "missed", "current", "match_percent", "complete_percent")
                    st.sstate = dict(zip(keys, map(int, m.groups()), strict=True))
                return None
            if line.startswith("Summary: "):
                m = _FAILED_HEAD.match(line)
                if m:
                    self._in_failed_list = True
                    return None
                m = _COUNT.match(line)
                if m:
                    if m.group(2) == "ERROR":
                        st.error_messages = int(m.group(1))
                    else:
                        st.warning_messages = int(m.group(1))
            return None
        if c == "E":
            if line.startswith("ERROR: "):
                return self._error(line)
            if line.startswith("Execution was interrupted"):
                st.interrupted = True
            return None
        if c == "P" and line.startswith("Parsing of "):
            m = _PARSED.match(line)
            if m:
                st.recipes_parsed = int(m.group(1))
                return Phase("parsed")
        return None

    def _error(self, line: str) -> Failure | None:
        st = self.stats
        if line.startswith(_LOGFILE):
            path = line[len(_LOGFILE) :].strip()
            if self._pending_log_for is not None:
                # Provisional key until "Task (<tid>) failed" names the task precisely.
                st.failures.setdefault(self._pending_log_for, path)
            self._last_failed = path
            return None
        m = _TASK_FAILED.match(line)
        if m:
            tid = m.group(1)
            log = self._last_failed
            if self._pending_log_for is not None:
                log = st.failures.pop(self._pending_log_for, log)
            st.failures[tid] = log
            self._pending_log_for = None
            self._last_failed = None
            return Failure(tid, log)
        m = _TASK_ERROR.match(line)
        if m:
            self._pending_log_for = f"{m.group(1)}:{m.group(2)}"
            if len(st.task_errors) < _MAX_ERRORS_KEPT:
                st.task_errors.append(line[len("ERROR: ") :])
            return None
        if len(st.task_errors) < _MAX_ERRORS_KEPT:
            st.task_errors.append(line[len("ERROR: ") :])
        return None

    def _failed_list_item(self, line: str) -> Failure | None:
        st = self.stats
        stripped = line.strip()
        if stripped.startswith("log: "):
            if self._last_failed is not None:
                st.failures[self._last_failed] = stripped[len("log: ") :]
            return None
        self._last_failed = stripped
        if stripped in st.failures:
            return None  # already announced by "ERROR: Task (...) failed"
        st.failures[stripped] = None
        return Failure(stripped, None)


def scan_stream(src: IO[bytes], tee: IO[bytes] | None = None, block: int = 4 << 20) -> BitbakeParser:
    """Parse a whole stream (a pipe or a recorded log), copying it to ``tee`` unchanged.

    Per block, the rare lines (summaries, errors, failures) go through ``feed`` in order;
    the "Running (setscene) task" lines, a third of a build's output, are counted and only
    the block's last of each kind is parsed, since progress is a snapshot. The result is
    the same Stats as feeding every line, except ``lines`` (not counted here).
    """
    parser = BitbakeParser()
    partial = b""  # the unfinished last line of the previous block
    while True:
        chunk = src.read(block)
        if not chunk:
            break
        if tee is not None:
            tee.write(chunk)
        first = chunk.find(b"\n")
        if first < 0:
            partial += chunk
            continue
        # the line straddling the block boundary (small), then the block in place: no copies
        joined = b"\n" + partial + chunk[: first + 1]
        _scan_block(parser, joined, 0, len(joined))
        last = chunk.rfind(b"\n")
        _scan_block(parser, chunk, first, last + 1)
        partial = chunk[last + 1 :]
    if partial:
        joined = b"\n" + partial + b"\n"
        _scan_block(parser, joined, 0, len(joined))
    return parser


def _scan_block(parser: BitbakeParser, data: bytes, start: int, end: int) -> None:
    """Lines of ``data[start:end]``, which starts with a newline and ends after one."""
    feed = parser.feed
    st = parser.stats
    for m in RARE.finditer(data, start, end):
        feed(m.group()[1:].decode("utf-8", "replace").rstrip("\r"))
    setscene = data.count(_B_SETSCENE, start, end)
    running = data.count(_B_RUNNING, start, end)
    if setscene:
        at = data.rfind(_B_SETSCENE, start, end) + 1
        feed(data[at : data.index(b"\n", at)].decode("utf-8", "replace").rstrip("\r"))
        st.setscene_started += setscene - 1
    tasks = running - setscene
    if tasks:
        at = data.rfind(_B_RUNNING, start, end)
        while data.startswith(_B_SETSCENE, at):  # the last non-setscene one
            at = data.rfind(_B_RUNNING, start, at)
        at += 1
        feed(data[at : data.index(b"\n", at)].decode("utf-8", "replace").rstrip("\r"))
        st.tasks_started += tasks - 1


def main(argv: list[str] | None = None) -> int:
    """``python -m alma.imagebuild.progress [--per-line] [COPY]``: parse bitbake output on stdin,
    copy it to COPY (like the build log), print the summary as JSON on stderr.

    The default reads blocks (``scan_stream``); ``--per-line`` hands every line to ``feed``
    as ``alma build`` does through the runner's line callback.
    """
    import json
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    per_line = "--per-line" in args
    args = [a for a in args if a != "--per-line"]
    src = sys.stdin.buffer
    with open(args[0] if args else "/dev/null", "wb") as tee:
        if per_line:
            parser = BitbakeParser()
            feed = parser.feed
            for raw in src:
                tee.write(raw)
                feed(raw.decode("utf-8", "replace").rstrip("\r\n"))
        else:
            parser = scan_stream(src, tee)
    print(json.dumps(parser.stats.summary()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
