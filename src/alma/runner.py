"""The one runner for external tools (kas, bitbake, initrd-flash, bmaptool, ssh, ...).

It logs ``cwd$ cmd``, streams every output line to a callback and a log file, enforces an
overall timeout and optional per-phase deadlines (``Deadline``; NVIDIA's scripts have no
timeouts of their own) whatever the output rate, optionally caps the output it will read
(``max_output``), stops the whole process group on timeout, cap or Ctrl-C, and never uses
a shell. One thread, one ``selectors`` loop: memory stays bounded by the cap and the line
length limit, never by how fast the tool writes. Binary names resolve through
``alma.settings.tool`` so config can point elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from alma.errors import Interrupted, ToolError, ToolNotFound, ToolOutputLimit, ToolTimeout

log = logging.getLogger("alma.runner")

# Grace between SIGINT/SIGTERM and SIGKILL when stopping a tool: bitbake needs a few
# seconds to stop its workers and write its cache cleanly.
STOP_GRACE_S = 10.0


class Deadline:
    """A resettable deadline, so a caller can give each phase of a tool its own budget.

    ``on_line`` callbacks call ``reset(seconds, phase)`` when they see a phase banner.
    """

    def __init__(self, seconds: float | None, phase: str = "run") -> None:
        self.phase = phase
        self._clock = time.monotonic
        self._end = None if seconds is None else self._clock() + seconds
        self.seconds = seconds

    def reset(self, seconds: float | None, phase: str) -> None:
        self.phase = phase
        self.seconds = seconds
        self._end = None if seconds is None else self._clock() + seconds

    def remaining(self) -> float | None:
        return None if self._end is None else self._end - self._clock()

    def expired(self) -> bool:
        rem = self.remaining()
        return rem is not None and rem <= 0


@dataclass
class Result:
    argv: list[str]
    returncode: int
    duration_s: float
    lines: list[str] = field(default_factory=list)  # only when keep_lines=True
    stderr_lines: list[str] = field(default_factory=list)  # only with stderr="separate"
    log_path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def format_command(argv: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """The ``cwd$ cmd`` line that is logged and shown by --dry-run."""
    where = str(cwd) if cwd is not None else os.getcwd()
    return f"{where}$ {shlex.join(str(a) for a in argv)}"


def resolve(argv0: str, env: Mapping[str, str] | None = None) -> str:
    """Find an executable or raise ToolNotFound with an install hint."""
    if os.sep in argv0:
        if os.access(argv0, os.X_OK):
            return argv0
        raise ToolNotFound(f"{argv0}: not found or not executable", hint=f"check the path {argv0}")
    path = (env or os.environ).get("PATH", os.defpath)
    found = shutil.which(argv0, path=path)
    if found is None:
        raise ToolNotFound(
            f"{argv0}: command not found on PATH",
            hint=f'install {argv0}, or set its path in alma.toml [tools] {argv0} = "/path"',
        )
    return found


# A line longer than this is handed on in pieces of this size: one unbroken 3 GB "line"
# (``head -c 3G /dev/zero``) must not become one 3 GB buffer.
MAX_LINE = 1 << 20
_READ = 65536


class _Lines:
    """Splits one stream's chunks into lines; keeps the unfinished tail.

    The tail is a list of pieces joined only when a line ends (or reaches ``max_line``), so
    a long partial line costs O(its length), not a re-copy on every chunk.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max(1, max_line)
        self._parts: list[bytes] = []
        self._size = 0

    def _pieces(self, raw: bytes) -> list[str]:
        if len(raw) <= self.max_line:
            return [_decode(raw)]
        return [_decode(raw[i : i + self.max_line]) for i in range(0, len(raw), self.max_line)]

    def feed(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:nl]
            if self._parts:
                piece = b"".join([*self._parts, piece])
                self._parts, self._size = [], 0
            out += self._pieces(piece)
            start = nl + 1
        if start < len(chunk):
            rest = chunk[start:] if start else chunk
            self._parts.append(rest)
            self._size += len(rest)
            if self._size >= self.max_line:
                joined = b"".join(self._parts)
                whole = len(joined) - len(joined) % self.max_line
                out += self._pieces(joined[:whole])
                tail = joined[whole:]
                self._parts, self._size = ([tail], len(tail)) if tail else ([], 0)
        return out

    def flush(self) -> list[str]:
        rest = b"".join(self._parts)
        self._parts, self._size = [], 0
        return self._pieces(rest) if rest else []


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r")


def _stop_group(proc: subprocess.Popen[bytes], first: int, grace: float = STOP_GRACE_S) -> None:
    """Signal the tool's whole process group, escalate to SIGKILL after a grace."""
    try:
        os.killpg(proc.pid, first)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | Deadline | None = None,
    on_line: Callable[[str], None] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    check: bool = True,
    keep_lines: bool = False,
    stdin: int | None = subprocess.DEVNULL,
    what: str | None = None,
    stderr: str = "merge",
    flush_partial_after: float | None = None,
    max_output: int | None = None,
    max_line: int = MAX_LINE,
    stop_grace: float = STOP_GRACE_S,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    pass_fds: Sequence[int] = (),
) -> Result:
    """Run ``argv`` (never through a shell), streaming stdout+stderr line by line.

    Raises ToolNotFound, ToolTimeout (with the phase that overran), ToolOutputLimit (more
    than ``max_output`` bytes on stdout+stderr), Interrupted on Ctrl-C (after stopping the
    tool's process group with SIGINT), and ToolError on a non-zero exit when ``check``.

    The deadline holds whatever the output rate (it is checked before every read, not only
    when the tool is quiet) and memory stays O(``max_output``) with ``keep_lines``, or
    O(``max_line``) without: a line longer than ``max_line`` bytes is handed on in pieces.
    ``stop_grace`` is how long a stopped tool gets between SIGTERM and SIGKILL.

    ``stderr="separate"`` keeps stderr out of ``on_line`` (ssh delivers the remote side's
    stderr there; parsers must not see it spliced into stdout) and returns it in
    ``Result.stderr_lines``; it is still written to the log, prefixed ``stderr: ``.
    ``flush_partial_after=S`` hands an unfinished line to ``on_line`` once the tool has been
    quiet for S seconds (prompts, "Waiting for USB storage device ......").
    ``on_start(proc)`` is called once the tool runs (its pid is its process group's id).
    ``pass_fds`` are inherited by the tool (e.g. a lock that must outlive alma: alma.flash.lock).
    """
    if stderr not in ("merge", "separate"):
        raise ValueError(f"stderr must be 'merge' or 'separate', not {stderr!r}")
    args = [str(a) for a in argv]
    full_env = dict(os.environ if env is None else env)
    args[0] = resolve(args[0], full_env)
    name = what or Path(args[0]).name
    deadline = timeout if isinstance(timeout, Deadline) else Deadline(timeout)
    cmdline = format_command(args, cwd)
    log.info("%s", cmdline)

    logf: IO[str] | None = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        # never through a link: a log named by a tool's own tree must not append into its target
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        # Line-buffered: the log is followed live (docs/build.md: "tail -f it"); block-buffered
        # it lagged up to 8 KiB behind the tool.
        logf = open(fd, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in finally
        logf.write(cmdline + "\n")

    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=full_env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if stderr == "merge" else subprocess.PIPE,
            start_new_session=True,  # own process group: we can stop it and its children
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        if logf:
            logf.close()
        raise ToolError(f"{name}: cannot start: {exc}", hint="check the tool's installation") from exc

    sink = _Sink(logf, keep_lines, on_line)
    stop = _Stop(proc, name, deadline, stop_grace, str(log_path) if log_path else None)
    try:
        if on_start is not None:
            on_start(proc)
        _pump(proc, sink, stop, max_line=max_line, max_output=max_output, flush_partial_after=flush_partial_after)
    finally:
        if logf:
            logf.close()
    result = Result(
        argv=args,
        returncode=proc.returncode,
        duration_s=time.monotonic() - started,
        lines=sink.lines,
        stderr_lines=sink.err_lines,
        log_path=Path(log_path) if log_path else None,
    )
    if check and proc.returncode != 0:
        raise ToolError(
            f"{name} exited with code {proc.returncode}",
            returncode=proc.returncode,
            log_path=str(log_path) if log_path else None,
            hint=f"see the log {log_path}" if log_path else None,
        )
    return result


@dataclass
class _Sink:
    """Where a tool's lines go: its log (stderr lines prefixed), the kept lines, stderr's own
    list (``stderr="separate"``) and the caller's ``on_line``."""

    logf: IO[str] | None
    keep_lines: bool
    on_line: Callable[[str], None] | None
    lines: list[str] = field(default_factory=list)
    err_lines: list[str] = field(default_factory=list)

    def deliver(self, tag: str, batch: list[str]) -> None:
        for line in batch:
            if tag == "err":
                self.err_lines.append(line)
                if self.logf:
                    self.logf.write("stderr: " + line + "\n")
                continue
            if self.logf:
                self.logf.write(line + "\n")
            if self.keep_lines:
                self.lines.append(line)
            if self.on_line:
                self.on_line(line)


@dataclass
class _Stop:
    """Stops the tool's process group and says why (the error the pump raises)."""

    proc: subprocess.Popen[bytes]
    name: str
    deadline: Deadline
    grace: float
    log_path: str | None

    @property
    def hint(self) -> str:
        return "see the log" + (f" {self.log_path}" if self.log_path else "")

    def timed_out(self) -> ToolTimeout:
        _stop_group(self.proc, signal.SIGTERM, self.grace)
        return ToolTimeout(
            f"{self.name}: no completion of phase '{self.deadline.phase}' within {self.deadline.seconds:.0f} s; "
            "stopped it",
            hint=self.hint,
            log_path=self.log_path,
        )

    def over_limit(self, max_output: int) -> ToolOutputLimit:
        _stop_group(self.proc, signal.SIGTERM, self.grace)
        return ToolOutputLimit(
            f"{self.name}: output over the limit of {max_output} bytes; stopped it", hint=self.hint,
            log_path=self.log_path,
        )  # fmt: skip


def _pump(
    proc: subprocess.Popen[bytes],
    sink: _Sink,
    stop: _Stop,
    *,
    max_line: int,
    max_output: int | None,
    flush_partial_after: float | None,
) -> None:
    """Read the tool's pipes into ``sink`` until they close and the tool exits, all within
    ``stop.deadline``; on a timeout, the output cap, Ctrl-C or any error the process group
    is stopped before the error leaves. The pipes are closed on the way out."""
    assert proc.stdout is not None
    streams = {"out": proc.stdout} if proc.stderr is None else {"out": proc.stdout, "err": proc.stderr}
    sel = selectors.DefaultSelector()
    for tag, stream in streams.items():
        sel.register(stream.fileno(), selectors.EVENT_READ, tag)
    splitters = {tag: _Lines(max_line) for tag in streams}
    deadline = stop.deadline
    last_data = time.monotonic()
    total = 0
    try:
        while sel.get_map():
            if deadline.expired():  # before every read: a flood cannot starve the deadline
                raise stop.timed_out()
            rem = deadline.remaining()
            events = sel.select(0.2 if rem is None else max(0.0, min(0.2, rem)))
            if not events:
                if flush_partial_after is not None and time.monotonic() - last_data >= flush_partial_after:
                    sink.deliver("out", splitters["out"].flush())
                continue
            for key, _ in events:
                tag = str(key.data)
                chunk = os.read(key.fd, _READ)
                if not chunk:
                    sel.unregister(key.fd)
                    sink.deliver(tag, splitters[tag].flush())
                    continue
                total += len(chunk)
                if max_output is not None and total > max_output:
                    raise stop.over_limit(max_output)
                last_data = time.monotonic()
                sink.deliver(tag, splitters[tag].feed(chunk))
        # Output closed; the tool may still be running (or hung in exit): same deadline.
        while True:
            rem = deadline.remaining()
            try:
                proc.wait(timeout=None if rem is None else max(0.01, rem))
                break
            except subprocess.TimeoutExpired:
                if deadline.expired():
                    raise stop.timed_out() from None
    except KeyboardInterrupt:
        _stop_group(proc, signal.SIGINT, stop.grace)
        raise Interrupted(f"{stop.name}: interrupted; stopped it cleanly") from None
    except BaseException:
        if proc.poll() is None:
            _stop_group(proc, signal.SIGTERM, stop.grace)
        raise
    finally:
        sel.close()
        for stream in streams.values():
            stream.close()


def capture(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 60.0,
    check: bool = True,
    stderr: str = "merge",
) -> Result:
    """Run a short tool and keep its output lines (e.g. ``systemd-analyze``, ``git``)."""
    return run(argv, cwd=cwd, env=env, timeout=timeout, check=check, keep_lines=True, stderr=stderr)


def run_attached(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run an interactive tool on this terminal (``kas shell``): stdin, stdout and stderr are
    the caller's, so the user's shell keeps its prompt, job control and colours. Ctrl-C goes to
    the tool (same process group, like any foreground command); alma waits for it to end and
    returns its exit code. Never a shell of alma's making: ``argv`` is executed as given."""
    args: list[str] = [resolve(str(argv[0]), env), *map(str, argv[1:])]
    log.info("%s", format_command(args, cwd))
    try:
        proc = subprocess.Popen(args, cwd=cwd, env=None if env is None else dict(env))
    except FileNotFoundError:
        raise ToolNotFound(f"{args[0]} not found", hint="install it, or set its path in alma.toml [tools]") from None
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the tool got the same SIGINT and decides; keep waiting for it
            continue
