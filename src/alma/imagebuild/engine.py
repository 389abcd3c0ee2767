"""Run a planned build: preflight, then kas + bitbake through the runner, parsed live.

The full output goes to ``build/<machine>/alma-build-<stamp>.log`` (``alma-build-latest.log``
points at the newest) with the command, the generated config and the summary around it.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from alma import runner
from alma.buildtree import TREE_RECORD
from alma.errors import Interrupted, PreflightError
from alma.ground import utc_stamp, write_atomic
from alma.imagebuild import preflight as pf
from alma.imagebuild.graph import BUILDLIST, TASK_DOT, Graph, read_graph
from alma.imagebuild.plan import BuildPlan
from alma.imagebuild.progress import BitbakeParser, Failure, Phase, Stats, TaskStarted, short_task

LATEST = "alma-build-latest.log"
TAIL_LINES = 15


class Display(Protocol):
    def event(self, ev: TaskStarted | Phase | Failure, stats: Stats) -> None: ...

    def close(self) -> None: ...


@dataclass
class Outcome:
    plan: BuildPlan
    status: str  # "succeeded" | "failed" | "interrupted"
    returncode: int | None
    duration_s: float
    stats: Stats
    log_path: Path
    tail: list[str] = field(default_factory=list)  # the last output lines, shown when nothing else explains a failure
    graph: Graph | None = None  # --check: what bitbake -g says the image needs
    reason: str | None = None  # why a run that exited 0 is still a negative verdict

    @property
    def failed_in(self) -> str:
        """Which tool stopped: "kas" (checkout, config: bitbake never spoke) or "bitbake"."""
        st = self.stats
        spoke = st.recipes_parsed is not None or st.task_total or st.error_messages is not None or st.failures
        return "bitbake" if spoke else "kas"

    def hint(self) -> str:
        """The next step after a failed run, matching what failed."""
        full = f"full output: {self.log_path}"
        if self.reason:
            return f"add the missing components to the image (IMAGE_INSTALL), then: alma build --check; {full}"
        if self.stats.failures:
            return f"read the failed tasks' logs listed above; {full}"
        if self.failed_in == "kas":
            return f"kas stopped before bitbake started (checkout or config): its last output above says why; {full}"
        return f"bitbake stopped before running tasks (parse or dependency error): see the ERROR lines above; {full}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "mode": self.plan.mode,
            "machine": self.plan.request.machine,
            "image": self.plan.request.image,
            "tool_returncode": self.returncode,
            "failed_in": self.failed_in if self.status == "failed" and self.returncode else None,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "log": str(self.log_path),
            "graph": self.graph.to_dict() if self.graph else None,
            **self.stats.summary(),
        }


def preflight_problems(plan: BuildPlan, probes: pf.Probes, network: bool = True) -> list[pf.Problem]:
    return pf.problems(plan, probes, network)


def require_preflight(plan: BuildPlan, probes: pf.Probes) -> None:
    problems = preflight_problems(plan, probes)
    if problems:
        err = PreflightError(problems)
        n = len(problems)
        err.message = (
            f"{plan.mode} not started: {n} problem{'s' if n != 1 else ''} to fix first "
            "(every offline step passed: kas files valid, commands and config computed; see --dry-run):\n  "
            + "\n  ".join(f"{what}\n      fix: {fix}" for what, fix in problems)
        )
        raise err


AUTO_CONF_MARK = "# Written by `alma shell`"  # earlier alma shells put the config there: removed


def _auto_conf(plan: BuildPlan) -> Path:
    return plan.machine_dir / "conf" / "auto.conf"


def _drop_old_auto_conf(plan: BuildPlan) -> None:
    # auto.conf is read before local.conf: a config left there by an earlier alma shell would
    # lose to the kas files where alma build's -R wins, so it must not outlive that shell
    auto = _auto_conf(plan)
    if auto.is_file() and auto.read_text(encoding="utf-8", errors="replace").startswith(AUTO_CONF_MARK):
        auto.unlink()


def _write_tree_record(plan: BuildPlan) -> None:
    """The directories this run gives kas and bitbake, for alma verify (alma.buildtree.TREE_RECORD)."""
    record = dict(plan.env)
    if plan.tree.tmp_dir is not None:  # bitbake's TMPDIR outside TOPDIR: alma verify looks there
        record["TMPDIR"] = str(plan.tree.tmp_dir)
    write_atomic(plan.machine_dir / TREE_RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n")


def shell(plan: BuildPlan, *, env: dict[str, str] | None = None) -> int:
    """``kas shell`` with the plan's files, environment and config: its command exports
    ``BBPOSTCONF`` (bitbake reads it as ``-R``), so bitbake typed in the shell reads the config
    at the same point as ``alma build``'s. Returns the shell's (or ``-c`` command's) exit code."""
    plan.machine_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(plan.conf_path, plan.conf_text)
    _write_tree_record(plan)  # a build typed in the shell is verified where it went, as alma build's
    _drop_old_auto_conf(plan)
    full_env = dict(os.environ if env is None else env)
    full_env.update(plan.env)
    return runner.run_attached(plan.argv, cwd=plan.root, env=full_env)


def summary_lines(out: Outcome) -> list[str]:
    st = out.stats
    s = st.summary()
    mins, secs = divmod(int(out.duration_s), 60)
    hours, mins = divmod(mins, 60)
    dur = f"{hours}h{mins:02d}m{secs:02d}s" if hours else f"{mins}m{secs:02d}s"
    lines = [f"{out.plan.mode} {out.status} after {dur}: {out.plan.request.image} for {out.plan.request.machine}"]
    if st.recipes_parsed is not None:
        lines.append(f"  recipes parsed: {st.recipes_parsed}")
    if out.graph is not None:
        lines += out.graph.summary()
    if out.reason:
        lines.append(f"  {out.reason}")
    if out.status == "failed" and out.returncode:
        lines.append(f"  {out.failed_in} exited with code {out.returncode}")
    if s["tasks_attempted"] is not None:
        lines.append(
            f"  tasks: {s['tasks_attempted']} attempted, {s['tasks_run']} run, "
            f"{s['tasks_reused']} reused (sstate or up to date); setscene restored {s['setscene_run']}"
        )
    elif st.tasks_started or st.setscene_started:
        lines.append(f"  tasks: {st.tasks_started} started of {st.task_total}; setscene {st.setscene_started}")
    if st.sstate:
        sm = st.sstate
        lines.append(
            f"  sstate: {sm['match_percent']}% match ({sm['local']} local, {sm['mirrors']} mirror, "
            f"{sm['missed']} missed of {sm['wanted']} wanted)"
        )
    if st.failures:
        lines.append(f"  failed tasks ({len(st.failures)}):")
        for tid, log in st.failures.items():
            lines.append(f"    {short_task(tid)}  log: {log or '(none)'}")
    if st.error_messages:
        lines.append(f"  bitbake reported {st.error_messages} ERROR message(s)")
    if out.status == "failed" and not st.failures and out.tail:
        # kas failed before bitbake ran (checkout, config), or bitbake failed while parsing
        lines.append("  last output:")
        lines += [f"    {ln}" for ln in out.tail if ln.strip()]
    lines.append(f"  full log: {out.log_path}")
    return lines


def _point_latest(log_path: Path) -> None:
    link = log_path.parent / LATEST
    tmp = log_path.parent / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(log_path.name)
    os.replace(tmp, link)


def execute(
    plan: BuildPlan,
    display: Display,
    *,
    clock: Callable[[], float] = time.time,
    env: dict[str, str] | None = None,
) -> Outcome:
    """Write the generated config, run kas, parse its output live. Never raises on a
    bitbake failure or Ctrl-C: the Outcome says what happened (the CLI maps it to exit codes)."""
    plan.machine_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(plan.conf_path, plan.conf_text)
    _write_tree_record(plan)
    _drop_old_auto_conf(plan)
    if plan.request.check:  # a graph left by an earlier run must not pass for this one's
        for name in (BUILDLIST, TASK_DOT):
            (plan.machine_dir / name).unlink(missing_ok=True)
    started = clock()
    stamp = utc_stamp(started)
    log_path = plan.machine_dir / f"alma-build-{stamp}.log"
    n = 1
    while log_path.exists():  # two runs within one second
        n += 1
        log_path = plan.machine_dir / f"alma-build-{stamp}-{n}.log"
    header = [
        f"# alma build ({plan.mode}) {plan.request.image} for {plan.request.machine}, started {stamp} UTC",
        *(f"# env {k}={v}" for k, v in plan.env.items()),
        f"# {plan.conf_path}:",
        *("#   " + ln for ln in plan.conf_text.splitlines()),
    ]
    log_path.write_text("\n".join(header) + "\n", encoding="utf-8")
    _point_latest(log_path)

    parser = BitbakeParser()
    feed = parser.feed
    on_event = display.event
    stats = parser.stats

    tail: deque[str] = deque(maxlen=TAIL_LINES)
    keep = tail.append

    def on_line(line: str) -> None:
        keep(line)
        ev = feed(line)
        if ev is not None:
            on_event(ev, stats)

    full_env = dict(os.environ if env is None else env)
    full_env.update(plan.env)
    status, code = "failed", None
    t0 = time.monotonic()
    try:
        res = runner.run(
            plan.argv, cwd=plan.root, env=full_env, on_line=on_line, log_path=log_path, check=False, what="kas"
        )
        code = res.returncode
        if code == 0:
            status = "succeeded"
        elif stats.interrupted:
            status = "interrupted"
    except Interrupted:
        status, stats.interrupted = "interrupted", True
    finally:
        display.close()
    out = Outcome(plan, status, code, time.monotonic() - t0, stats, log_path, list(tail))
    if plan.request.check and status == "succeeded":
        out.graph = read_graph(plan.machine_dir, plan.request.image)
        if out.graph is None:
            out.status, out.reason = "failed", f"bitbake -g wrote no {BUILDLIST}/{TASK_DOT} in {plan.machine_dir}"
        elif out.graph.missing:
            out.status = "failed"
            out.reason = f"{plan.request.image} would lack ALMA components: {', '.join(out.graph.missing)}"
    with log_path.open("a", encoding="utf-8") as fh:
        if status == "interrupted" and code is None:
            fh.write("# alma: interrupted (Ctrl-C); bitbake was sent SIGINT and stopped\n")
        fh.write("\n".join("# " + ln for ln in summary_lines(out)) + "\n")
    return out
