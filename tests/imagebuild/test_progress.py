"""The bitbake output parser: formats of bitbake 2.8 / oe-core scarthgap, line and block modes agree."""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from support_build import FAKES

from alma.imagebuild.progress import BitbakeParser, Failure, Phase, TaskStarted, scan_stream, short_task

BB = "/srv/oe/meta/recipes-core/busybox/busybox_1.36.1.bb"
LOG = "/srv/b/tmp/work/cortexa78ae-alma-linux/busybox/1.36.1/temp/log.do_compile.4242"
FAILED_RUN = [
    "Parsing of 2174 .bb files complete (0 cached, 2174 parsed). 3532 targets, 212 skipped, 0 masked, 0 errors.",
    "Sstate summary: Wanted 2210 Local 1800 Mirrors 0 Missed 410 Current 391 (81% match, 84% complete)",
    "NOTE: Executing Tasks",
    f"NOTE: Running setscene task 12 of 645 ({BB}:do_populate_sysroot_setscene)",
    f"NOTE: Running noexec task 7 of 3011 ({BB}:do_build)",
    f"NOTE: Running task 1201 of 3011 ({BB}:do_compile)",
    "NOTE: recipe busybox-1.36.1-r0: task do_compile: Started",
    "ERROR: busybox-1.36.1-r0 do_compile: oe_runmake failed",
    f"ERROR: Logfile of failure stored in: {LOG}",
    "Log data follows:",
    "| ERROR: oe_runmake failed",
    f"ERROR: Task ({BB}:do_compile) failed with exit code '1'",
    "NOTE: Tasks Summary: Attempted 3011 tasks of which 2188 didn't need to be rerun and 1 failed.",
    "",
    "Summary: 1 task failed:",
    f"  {BB}:do_compile",
    f"    log: {LOG}",
    "Summary: There was 1 WARNING message.",
    "Summary: There were 2 ERROR messages, returning a non-zero exit code.",
]


def test_events_and_stats_of_a_failed_run():
    p = BitbakeParser()
    events = [e for e in map(p.feed, FAILED_RUN) if e is not None]
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Phase",
        "Phase",
        "TaskStarted",
        "TaskStarted",
        "TaskStarted",
        "Failure",
    ]  # once, not again in the summary
    assert isinstance(events[0], Phase) and events[0].name == "parsed"
    ss = events[2]
    assert isinstance(ss, TaskStarted) and (ss.kind, ss.number, ss.total) == ("setscene", 12, 645)
    assert isinstance(events[3], TaskStarted) and events[3].kind == "noexec"
    fail = events[5]
    assert isinstance(fail, Failure) and fail.tid == f"{BB}:do_compile" and fail.log == LOG
    s = p.stats.summary()
    assert s["tasks_attempted"] == 3011 and s["tasks_reused"] == 2188 and s["tasks_run"] == 823
    assert s["sstate"] == {
        "wanted": 2210, "local": 1800, "mirrors": 0, "missed": 410, "current": 391,
        "match_percent": 81, "complete_percent": 84,
    }  # fmt: skip
    assert s["failed_tasks"] == [{"task": f"{BB}:do_compile", "log": LOG}]
    assert (s["errors"], s["warnings"]) == (2, 1)
    assert p.stats.task_errors[0] == "busybox-1.36.1-r0 do_compile: oe_runmake failed"


def test_all_succeeded_summary_and_interruption():
    p = BitbakeParser()
    p.feed("NOTE: Tasks Summary: Attempted 40 tasks of which 20 didn't need to be rerun and all succeeded.")
    p.feed("Execution was interrupted, returning a non-zero exit code.")
    assert (p.stats.attempted, p.stats.reused, p.stats.failed_count) == (40, 20, 0)
    assert p.stats.interrupted


def test_unrelated_lines_are_ignored():
    p = BitbakeParser()
    for line in ("NOTE: recipe x-1.0-r0: task do_fetch: Started", "| Summary: fake", "WARNING: x", "", "NOTE: Running"):
        assert p.feed(line) is None
    assert p.stats.summary()["tasks_attempted"] is None and p.stats.failures == {}


def test_short_task_names():
    assert short_task(f"{BB}:do_compile") == "busybox_1.36.1:do_compile"
    assert short_task(f"virtual:native:{BB}:do_install") == "virtual:native:busybox_1.36.1:do_install"
    assert short_task(f"mc:orin:{BB}:do_fetch") == "mc:orin:busybox_1.36.1:do_fetch"


def _fake_output(scenario: str) -> bytes:
    env = {"FAKE_BITBAKE_SCENARIO": scenario, "PATH": "/usr/bin:/bin"}
    # The fake writes its task logs under its cwd, like bitbake under its build dir.
    with tempfile.TemporaryDirectory() as build_dir:
        res = subprocess.run(
            [sys.executable, str(FAKES / "bitbake"), "alma-image"],
            capture_output=True,
            env=env,
            timeout=60,
            cwd=build_dir,
        )
    return res.stdout


@settings(max_examples=40, deadline=None)
@given(block=st.integers(min_value=1, max_value=5000), scenario=st.sampled_from(["success", "fail"]))
def test_block_scan_equals_line_by_line(block, scenario, tmp_path_factory):
    data = _CACHE.get(scenario) or _CACHE.setdefault(scenario, _fake_output(scenario))
    ref = BitbakeParser()
    for line in data.decode().splitlines():
        ref.feed(line)
    tee = io.BytesIO()
    got = scan_stream(io.BytesIO(data), tee, block=block)
    assert tee.getvalue() == data
    assert got.stats.summary() == ref.stats.summary()
    assert (got.stats.task_number, got.stats.setscene_number, got.stats.current) == (
        ref.stats.task_number,
        ref.stats.setscene_number,
        ref.stats.current,
    )


_CACHE: dict[str, bytes] = {}


def test_module_runs_as_a_filter(tmp_path):
    data = _fake_output("fail")
    copy = tmp_path / "copy.log"
    res = subprocess.run(
        [sys.executable, "-m", "alma.imagebuild.progress", str(copy)], input=data, capture_output=True, timeout=60
    )
    assert res.returncode == 0
    assert copy.read_bytes() == data
    assert b'"tasks_attempted": 45' in res.stderr


def test_failure_only_in_the_summary_list_is_still_announced():
    # e.g. the ERROR lines went to a part of the output we did not see
    p = BitbakeParser()
    evs = [p.feed(x) for x in ("Summary: 1 task failed:", f"  {BB}:do_compile", f"    log: {LOG}")]
    assert isinstance(evs[1], Failure) and evs[1].tid == f"{BB}:do_compile"
    assert p.stats.failures == {f"{BB}:do_compile": LOG}
