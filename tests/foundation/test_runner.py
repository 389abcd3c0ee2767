"""The one runner: streaming, logging, timeouts, process-group stop, Ctrl-C, no shell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from alma import runner
from alma.errors import Interrupted, ToolError, ToolNotFound, ToolTimeout

PY = sys.executable


def test_streams_lines_in_order_and_logs_command(tmp_path: Path) -> None:
    seen: list[str] = []
    log = tmp_path / "logs" / "tool.log"
    res = runner.run(
        [PY, "-c", "import sys\nfor i in range(3): print('line', i, flush=True)\nprint('err', file=sys.stderr)"],
        cwd=tmp_path,
        on_line=seen.append,
        log_path=log,
    )
    assert res.ok and res.returncode == 0
    assert seen[:3] == ["line 0", "line 1", "line 2"] and "err" in seen
    text = log.read_text()
    # first line of the log is the `cwd$ cmd` line
    assert text.splitlines()[0].startswith(f"{tmp_path}$ {PY} -c ")
    assert "line 2" in text


def test_nonzero_exit_raises_tool_error_with_code(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as ei:
        runner.run([PY, "-c", "raise SystemExit(7)"])
    assert ei.value.returncode == 7 and ei.value.exit_code == 1  # the tool's code is reported, alma exits 1
    res = runner.run([PY, "-c", "raise SystemExit(7)"], check=False)
    assert res.returncode == 7


def test_missing_tool_is_a_user_error_with_hint() -> None:
    with pytest.raises(ToolNotFound) as ei:
        runner.run(["alma-no-such-tool-xyz"])
    assert ei.value.exit_code == 2 and ei.value.hint and "install" in ei.value.hint


def test_shell_metacharacters_are_not_interpreted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    res = runner.capture([PY, "-c", "import sys; print(sys.argv[1])", f"x; touch {marker}"])
    assert res.lines == [f"x; touch {marker}"]
    assert not marker.exists()


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The tool forks a grandchild that would outlive a naive kill of the direct child.
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        print("waiting for USB storage device", flush=True)
        time.sleep(60)
        """
    )
    t0 = time.monotonic()
    with pytest.raises(ToolTimeout) as ei:
        runner.run([PY, "-c", script], timeout=runner.Deadline(1.0, phase="wait-board"))
    assert time.monotonic() - t0 < 45  # cut at 1 s, not the script's 60 s (load allowed)
    assert "wait-board" in ei.value.message
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("grandchild survived the timeout")


def test_deadline_reset_per_phase_keeps_a_progressing_tool_alive() -> None:
    deadline = runner.Deadline(0.6, phase="step1")

    def on_line(line: str) -> None:
        if line.startswith("step"):
            deadline.reset(0.6, line)

    script = "import time\nfor i in range(4):\n    print(f'step{i}', flush=True); time.sleep(0.3)"
    res = runner.run([PY, "-c", script], timeout=deadline, on_line=on_line)
    assert res.ok and deadline.phase == "step3"


def test_ctrl_c_sends_sigint_to_the_tool_and_raises_interrupted(tmp_path: Path) -> None:
    got = tmp_path / "got-sigint"
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        def h(*a):
            open({str(got)!r}, "w").write("yes"); sys.exit(130)
        signal.signal(signal.SIGINT, h)
        print("ready", flush=True)
        time.sleep(30)
        """
    )

    def on_line(line: str) -> None:
        if line == "ready":
            # What the terminal does on Ctrl-C: SIGINT to our process.
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()

    with pytest.raises(Interrupted) as ei:
        runner.run([PY, "-c", script], on_line=on_line)
    assert ei.value.exit_code == 130
    assert got.read_text() == "yes"


def test_format_command_quotes_arguments() -> None:
    assert runner.format_command(["kas", "shell", "a b.yml", "-c", "bitbake x"], "/w") == (
        "/w$ kas shell 'a b.yml' -c 'bitbake x'"
    )


def test_separate_stderr_never_splices_into_stdout_lines(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "for i in range(200):\n"
        "    sys.stdout.write(f'out{i}\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write(f'noise{i}\\n'); sys.stderr.flush()\n"
    )
    seen: list[str] = []
    log = tmp_path / "t.log"
    res = runner.run([PY, "-c", script], on_line=seen.append, stderr="separate", log_path=log)
    assert seen == [f"out{i}" for i in range(200)]
    assert res.stderr_lines == [f"noise{i}" for i in range(200)]
    assert "stderr: noise199" in log.read_text()


def test_unfinished_line_is_flushed_after_quiet_period(tmp_path: Path) -> None:
    # The tool stays quiet until it learns (a file the callback writes) that its unfinished
    # line was handed over: with the option that happens while it runs; without it, only at
    # its exit. Order, not elapsed time, so a loaded host cannot change the verdict.
    flag = tmp_path / "handed-over"
    script = (
        "import os, sys, time\n"
        "sys.stdout.write('Waiting for USB storage device sda...'); sys.stdout.flush()\n"
        f"end = time.monotonic() + float(sys.argv[1])\n"
        f"while not os.path.exists({str(flag)!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        f"print('', 'seen' if os.path.exists({str(flag)!r}) else 'unseen')\n"
    )

    def hand_over(seen: list[str]) -> Callable[[str], None]:
        def on_line(line: str) -> None:
            seen.append(line)
            flag.touch()

        return on_line

    seen: list[str] = []
    runner.run([PY, "-c", script, "120"], on_line=hand_over(seen), flush_partial_after=0.3)
    assert seen[0] == "Waiting for USB storage device sda..." and seen[-1].endswith("seen"), seen
    assert not seen[-1].endswith("unseen"), seen  # handed over while the tool was still waiting
    # without the option the same text only arrives at exit (the tool gives up waiting at 2 s)
    flag.unlink()
    late: list[str] = []
    runner.run([PY, "-c", script, "2"], on_line=hand_over(late))
    assert late[0].startswith("Waiting for USB storage device sda...") and late[0].endswith("unseen"), late


def test_bad_stderr_mode_is_rejected() -> None:
    with pytest.raises(ValueError):
        runner.run([PY, "-c", "pass"], stderr="discard")


# ---- bounded, deadline-true reads (issue 12) ---------------------------------------------


def isolated(code: str, hard_limit: float = 40.0) -> dict[str, object]:
    """Run ``code`` (which prints one JSON line) in a fresh interpreter: its own peak RSS,
    and a hard limit so a runner that never returns fails the test instead of hanging it."""
    import json

    prelude = textwrap.dedent(
        """
        import json, sys, time
        from alma import runner
        from alma.errors import ToolOutputLimit, ToolTimeout
        def rss_mb():
            # VmHWM is this address space's peak; ru_maxrss is not: after subprocess's vfork
            # + exec it starts at the parent's (pytest's) peak, ~130 MB in a full run.
            with open("/proc/self/status") as fh:
                return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:")) / 1024
        """
    )
    try:
        r = subprocess.run([PY, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=hard_limit)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the runner did not return within {hard_limit} s")
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_an_endless_flood_with_timeout_5s_is_cut_under_100mb() -> None:
    # Endless, so only the deadline can end it (isolated()'s hard limit fails a runner that
    # never returns): the verdict does not depend on how fast this host streams.
    got = isolated(
        """
        seen = [0]
        outcome = "completed"
        try:
            runner.run(["cat", "/dev/zero"], timeout=5,
                       on_line=lambda s: seen.__setitem__(0, seen[0] + len(s)), check=False)
        except ToolTimeout:
            outcome = "timeout"
        print(json.dumps({"rss": rss_mb(), "outcome": outcome, "seen": seen[0]}))
        """,
        hard_limit=120.0,
    )
    assert got["outcome"] == "timeout", got
    assert float(got["rss"]) < 100, got  # type: ignore[arg-type]


def test_fast_short_lines_cannot_starve_the_deadline() -> None:
    """`yes` floods short lines: the old runner only looked at the clock when its queue was empty."""
    got = isolated(
        """
        try:
            runner.run(["yes"], timeout=1.5, on_line=lambda s: None)
            outcome = "completed"
        except ToolTimeout:
            outcome = "timeout"
        print(json.dumps({"rss": rss_mb(), "outcome": outcome}))
        """,
        hard_limit=120.0,  # `yes` never ends: a starved deadline is a runner that never returns
    )
    assert got["outcome"] == "timeout", got
    assert float(got["rss"]) < 100, got  # type: ignore[arg-type]


def test_output_cap_stops_the_tool_and_bounds_memory() -> None:
    got = isolated(
        """
        try:
            runner.run(["cat", "/dev/zero"], timeout=600, keep_lines=True, max_output=1 << 20)
            outcome = "completed"
        except (ToolOutputLimit, ToolTimeout) as exc:
            outcome = exc.message
        print(json.dumps({"rss": rss_mb(), "outcome": outcome}))
        """,
        hard_limit=120.0,  # only the cap can end an endless tool before that
    )
    assert "output over the limit of 1048576 bytes" in str(got["outcome"]), got
    assert float(got["rss"]) < 100, got  # type: ignore[arg-type]


def test_tool_that_closes_its_output_and_hangs_still_times_out() -> None:
    got = isolated(
        """
        try:
            runner.run(["sh", "-c", "exec >&- 2>&-; sleep 3600"], timeout=1.0)
            outcome = "completed"
        except ToolTimeout:
            outcome = "timeout"
        print(json.dumps({"outcome": outcome}))
        """,
        hard_limit=120.0,  # the hang outlasts it: only the deadline can end the run in time
    )
    assert got["outcome"] == "timeout", got


def test_long_lines_are_split_into_bounded_pieces_without_loss() -> None:
    lines = runner._Lines(max_line=10)
    out = lines.feed(b"abc") + lines.feed(b"defghijklmnop") + lines.feed(b"q\nshort\r\nx" + b"y" * 25)
    out += lines.flush()
    assert out == ["abcdefghij", "klmnopq", "short", "xyyyyyyyyy", "yyyyyyyyyy", "yyyyyy"]
    assert all(len(s) <= 10 for s in out)
    # a line split across many chunks arrives whole when it is short enough
    lines = runner._Lines()
    got = [s for ch in (b'{"a"', b": 1", b"}\n") for s in lines.feed(ch)]
    assert got == ['{"a": 1}']
