"""Show a running build: a rich progress bar on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

from alma.imagebuild.progress import Failure, Phase, Stats, TaskStarted, short_task


class PlainDisplay:
    """One status line at most every ``interval`` seconds (logs and CI), failures at once."""

    def __init__(
        self, stream: IO[str] | None = None, interval: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream = stream or sys.stdout
        self.interval = interval
        self.clock = clock
        self._last = -1e18
        self.printed: list[str] = []

    def _print(self, text: str) -> None:
        self.printed.append(text)
        print(text, file=self.stream, flush=True)

    def event(self, ev: TaskStarted | Phase | Failure, stats: Stats) -> None:
        if isinstance(ev, Failure):
            self._print(f"FAILED {short_task(ev.tid)}" + (f"  log: {ev.log}" if ev.log else ""))
            return
        if isinstance(ev, Phase):
            if ev.name == "parsed":
                self._print(f"parsed {stats.recipes_parsed} recipes")
            else:
                self._print("executing tasks")
            return
        now = self.clock()
        if now - self._last < self.interval:
            return
        self._last = now
        self._print(status_line(stats))

    def close(self) -> None:
        return None


def status_line(stats: Stats) -> str:
    parts = []
    if stats.setscene_total:
        parts.append(f"setscene {stats.setscene_number}/{stats.setscene_total}")
    if stats.task_total:
        pct = 100 * stats.task_number // stats.task_total
        parts.append(f"tasks {stats.task_number}/{stats.task_total} ({pct}%)")
    if stats.current:
        parts.append(short_task(stats.current))
    return " | ".join(parts)


class RichDisplay:
    """Two bars (setscene restores, real tasks) and the task just started."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress: Any = Progress(
            TextColumn("{task.description:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[current]}"),
            transient=False,
        )
        self._setscene = self.progress.add_task("setscene", total=None, current="", visible=False)
        self._tasks = self.progress.add_task("tasks", total=None, current="waiting for bitbake")
        self.progress.start()

    def event(self, ev: TaskStarted | Phase | Failure, stats: Stats) -> None:
        p = self.progress
        if isinstance(ev, TaskStarted):
            if ev.kind == "setscene":
                p.update(self._setscene, total=ev.total, completed=ev.number, visible=True, current=short_task(ev.tid))
            else:
                p.update(self._tasks, total=ev.total, completed=ev.number, current=short_task(ev.tid))
        elif isinstance(ev, Failure):
            p.console.print(f"[red]FAILED[/red] {short_task(ev.tid)}  log: {ev.log or '(none)'}", highlight=False)
        elif ev.name == "parsed":
            p.update(self._tasks, current=f"parsed {stats.recipes_parsed} recipes")

    def close(self) -> None:
        self.progress.stop()
