"""Running one command on one node over OpenSSH, never prompting, always bounded.

The destination is handed to ``ssh`` as written in the fleet file, so ``~/.ssh/config``
(or the fleet's ``[ssh] config`` through ``-F``) decides user, port, keys and jump hosts.
Every call goes through ``alma.runner`` (its deadline stops ssh's whole process group, its
output cap bounds what a node can make us read), and a shared ``Deadline`` lets Ctrl-C stop
every call in flight at once.

The remote side is bounded too: sshd does not stop a command when the client goes away
(without a pty nothing sends it SIGHUP, and a command that does not write never sees the
closed channel), so each command runs under the node's own deadline: with ``python3`` on
the node (every ALMA-OS image: alma-health is Python) under ``reaper.py``, a child
subreaper that ends the command's WHOLE tree at the deadline or when the command ends,
children that called ``setsid()`` or outlived their parent included; else under coreutils
``timeout`` (its process group only: a ``setsid()`` child escapes); else unbounded
(docs/fleet.md). SIGTERM first, SIGKILL ``REMOTE_KILL_AFTER_S`` later.

Every path handed to ssh inside ``-o`` is quoted the way ssh splits it (alma.fleet.join.ssh_quote):
ssh reads UserKnownHostsFile as a whitespace-separated LIST, so an unquoted control dir with
a space would make it read a second, planted file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from alma import runner, settings
from alma.errors import ToolError, ToolNotFound, ToolOutputLimit, ToolTimeout
from alma.fleet.inventory import Node, SshConfig
from alma.fleet.join import pinned_fingerprint, pinned_ssh_options, ssh_quote
from alma.fleet.pinhook import PREFIX as PIN_MISMATCH

# ssh's own exit code for "could not connect / authenticate / protocol error".
SSH_FAILED = 255
# What one call may print (stdout + stderr); over it the node is UNKNOWN "output over limit".
MAX_OUTPUT = 1 << 20
REMOTE_KILL_AFTER_S = 2
# ssh exits at once on SIGTERM; do not give it the 10 s a bitbake gets.
SSH_STOP_GRACE_S = 1.0


@dataclass
class RemoteResult:
    node: str
    command: str
    returncode: int | None  # None: did not finish (timeout) or ssh could not start
    lines: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    error: str | None = None  # "timeout" | "over-limit" | "unreachable" | "ssh-missing"; None when ssh ran
    stderr: list[str] = field(default_factory=list)  # the remote side's (and ssh's) stderr

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    def why(self) -> str:
        """One line saying why the call failed (for reports)."""
        if self.error == "timeout":
            return f"no answer within {self.duration_s:.1f} s (timed out, ssh stopped)"
        if self.error == "over-limit":
            return f"output over limit ({self.lines[0] if self.lines else MAX_OUTPUT} bytes): ssh stopped"
        if self.error == "ssh-missing":
            return self.lines[0] if self.lines else "ssh is not installed"
        if self.error == "unreachable":
            pin = [ln for ln in self.lines if ln.startswith(PIN_MISMATCH)]
            if pin:  # the pinned key's own words: which key was expected and which was offered
                return f"Host key verification failed: {pin[-1][len('alma: '):]}"
            tail = [ln for ln in self.lines if ln.strip()]
            return "unreachable: " + (tail[-1] if tail else f"ssh exited {self.returncode}")
        tail = [ln for ln in self.stderr or self.lines if ln.strip()]
        return f"exit {self.returncode}" + (f": {tail[-1]}" if tail else "")


def require_ssh() -> str:
    """Fail once, up front, with an install hint, rather than once per node."""
    try:
        return runner.resolve(settings.tool("ssh"))
    except ToolNotFound as exc:
        raise ToolNotFound(exc.message, hint="install the OpenSSH client (Debian: openssh-client)") from None


def control_dir(cfg: SshConfig) -> Path:
    """Where ControlMaster sockets live (private: anyone who can open them uses the link)."""
    if cfg.control_dir is not None:
        d = cfg.control_dir
    else:
        d = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alma" / "ssh"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def trust_tag(node: Node, cfg: SshConfig) -> str:
    """What a shared master's host key was verified against, hashed: the node's pin, else the
    fleet's ssh config, known_hosts and policy. Masters are shared only under the same tag: a
    pinned node never rides a connection an unpinned entry (another fleet) opened, and two
    pins of one host never share one (ssh checks the key only when the master connects)."""
    what = "\0".join([pinned_fingerprint(node) or "unpinned", str(cfg.config or ""), str(cfg.known_hosts or ""),
                       cfg.strict_host_key_checking])  # fmt: skip
    return hashlib.sha256(what.encode()).hexdigest()[:8]


# A run's own masters (run_connections): idle this long they end by themselves, should the
# run die before it closes them.
RUN_PERSIST_S = 60
# sun_path holds 108 bytes; ssh binds at the path plus a 17-character suffix, then renames.
MAX_CONTROL_PATH = 108 - 18


@contextlib.contextmanager
def run_connections(cfg: SshConfig, nodes: Sequence[Node]) -> Iterator[SshConfig]:
    """The ssh settings for one run of many calls per node: one connection per node shared by
    the run's calls (a ControlMaster, keyed as ``control_persist``'s are, in a private
    directory of its own) and closed when the run ends. A fleet that keeps its own masters
    (``control_persist`` > 0) is used as it is; so is one whose socket path would not fit."""
    if cfg.control_persist > 0:
        yield cfg
        return
    d = Path(tempfile.mkdtemp(prefix="alma-ssh-"))  # 0700: whoever opens a socket uses the link
    try:
        if len(f"{d}/12345678-") + 40 > MAX_CONTROL_PATH:  # %C is 40 hex digits
            yield cfg
            return
        shared = dataclasses.replace(cfg, control_persist=RUN_PERSIST_S, control_dir=d)
        try:
            yield shared
        finally:
            for n in nodes:
                close_master(n, shared)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def close_master(node: Node, cfg: SshConfig) -> None:
    """End the node's shared connection, if one is open (``ssh -O exit``): what a reboot or
    a power cut leaves of it is dropped, and the next call connects afresh."""
    if cfg.control_persist <= 0 or not any(control_dir(cfg).iterdir()):
        return
    argv = ssh_argv(node, "", cfg)[:-3] + ["-O", "exit", "--", node.ssh]  # the master's own options
    with contextlib.suppress(ToolError, ToolNotFound):
        runner.run(argv, timeout=10, check=False, stderr="separate", what=f"ssh -O exit {node.name}",
                   stop_grace=SSH_STOP_GRACE_S)  # fmt: skip


REAPER = Path(__file__).with_name("reaper.py")


def remote_command(command: str, seconds: float | None) -> str:
    """``command`` under the node's own deadline (POSIX sh; see the module docstring)."""
    if seconds is None:
        return command
    inner = shlex.quote(command)
    limit = max(1, math.ceil(seconds))
    reaper = shlex.quote(REAPER.read_text(encoding="utf-8"))
    return (
        f"if command -v python3 >/dev/null 2>&1; "
        f"then exec python3 -I -S -c {reaper} {limit} {REMOTE_KILL_AFTER_S} {inner}; "
        f"elif command -v timeout >/dev/null 2>&1; then exec timeout -k {REMOTE_KILL_AFTER_S} {limit} sh -c {inner}; "
        f"else exec sh -c {inner}; fi"
    )


def ssh_argv(node: Node, command: str, cfg: SshConfig, *, remote_timeout: float | None = None) -> list[str]:
    """The full argv; the remote command is ONE argument after ``--`` and the destination.

    With ``remote_timeout`` the command is wrapped so the node stops it by itself too.
    """
    argv = [settings.tool("ssh")]
    if cfg.config is not None:
        argv += ["-F", str(cfg.config)]
    argv += pinned_ssh_options(node, cfg)  # a pinned host key, strictly checked
    argv += [
        "-o", "BatchMode=yes",  # never ask for a password or passphrase
        "-o", f"ConnectTimeout={cfg.connect_timeout}",
        "-o", f"StrictHostKeyChecking={cfg.strict_host_key_checking}",
        "-o", "LogLevel=ERROR",  # keep "Permanently added ..." out of the JSON stream
        "-T",  # no tty: the remote side must not wait for input
    ]  # fmt: skip
    if cfg.known_hosts is not None:
        argv += ["-o", f"UserKnownHostsFile={ssh_quote(str(cfg.known_hosts), '[ssh] known_hosts')}"]
    if cfg.control_persist > 0:
        # %C (a hash of host, port, user) keeps the socket path short; the prefix keys it by
        # what the master verified, so no connection checked another way can be reused.
        quoted_dir = ssh_quote(str(control_dir(cfg)), "[ssh] control_dir")[:-1]
        argv += [
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={quoted_dir}/{trust_tag(node, cfg)}-%C\"",
            "-o", f"ControlPersist={cfg.control_persist}",
        ]  # fmt: skip
    argv += ["--", node.ssh, remote_command(command, remote_timeout)]
    return argv


def run_remote(
    node: Node,
    command: str,
    cfg: SshConfig,
    *,
    timeout: float,
    cancel: runner.Deadline | None = None,
    run: Callable[..., runner.Result] = runner.run,
    max_output: int = MAX_OUTPUT,
) -> RemoteResult:
    """Run ``command`` on ``node``; never raises for remote failures, returns what happened.

    ``cancel`` is a Deadline shared by all calls of one fleet run: resetting it to 0 stops
    everything in flight (Ctrl-C). Each call still gets its own ``timeout``, here and (as
    the remote command's own deadline) on the node, and may print at most ``max_output``.
    """
    argv = ssh_argv(node, command, cfg, remote_timeout=timeout)
    deadline = runner.Deadline(timeout, phase=f"{node.name}: {command}")
    if cancel is not None:
        deadline = _Linked(deadline, cancel)
    started = time.monotonic()
    try:
        # Remote stderr apart: ssh would otherwise splice it byte-wise into the output we parse.
        res = run(argv, timeout=deadline, check=False, keep_lines=True, what=f"ssh {node.name}", stderr="separate",
                  max_output=max_output, stop_grace=SSH_STOP_GRACE_S)  # fmt: skip
    except ToolOutputLimit:
        return RemoteResult(node.name, command, None, [str(max_output)], time.monotonic() - started, error="over-limit")
    except ToolTimeout:
        return RemoteResult(node.name, command, None, [], time.monotonic() - started, error="timeout")
    except ToolNotFound as exc:
        return RemoteResult(node.name, command, None, [exc.message], 0.0, error="ssh-missing")
    except ToolError as exc:
        return RemoteResult(node.name, command, None, [exc.message], time.monotonic() - started, error="unreachable")
    err = "unreachable" if res.returncode == SSH_FAILED else None
    # On failure ssh's own message (stderr) is what explains it.
    out = (res.stderr_lines or res.lines) if err else res.lines
    return RemoteResult(node.name, command, res.returncode, out, res.duration_s, error=err, stderr=res.stderr_lines)


class _Linked(runner.Deadline):
    """A per-call deadline that also expires when the shared cancel deadline does."""

    def __init__(self, own: runner.Deadline, cancel: runner.Deadline) -> None:
        super().__init__(own.seconds, own.phase)
        self._own = own
        self._cancel = cancel

    def remaining(self) -> float | None:
        own, cancel = self._own.remaining(), self._cancel.remaining()
        if cancel is None:
            return own
        if own is None:
            return cancel
        return min(own, cancel)
