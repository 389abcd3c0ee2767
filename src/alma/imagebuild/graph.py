"""What ``bitbake -g <image>`` says the image needs: recipes, tasks, ALMA components, kernel.

``bitbake -g`` writes two files into its cwd (TOPDIR, ``build/<machine>``; bitbake 2.8
lib/bb/cooker.py ``generateDotGraphFiles``):

- ``pn-buildlist``: one recipe name (PN) a line, every recipe the target needs;
- ``task-depends.dot``: one node a task, labelled ``"<pn> <task>\\n:<PV>-<PR>\\n<recipe file>"``,
  then its edges.

The kernel is the recipe that has kernel.bbclass's ``do_shared_workdir`` task (whatever
PREFERRED_PROVIDER_virtual/kernel names: meta-tegra's ``linux-jammy-nvidia-tegra``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.artefacts.rootfs import COMPONENTS

BUILDLIST = "pn-buildlist"
TASK_DOT = "task-depends.dot"
KERNEL_TASK = "do_shared_workdir"  # kernel.bbclass: addtask shared_workdir after do_compile


@dataclass
class Graph:
    image: str
    recipes: list[str]
    tasks: int
    versions: dict[str, str] = field(default_factory=dict)  # pn -> PV-PR
    kernel: str | None = None

    def components(self) -> dict[str, bool]:
        have = set(self.recipes)
        return {c: c in have for c in COMPONENTS}

    @property
    def missing(self) -> list[str]:
        return [c for c, ok in self.components().items() if not ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "recipes": len(self.recipes),
            "tasks": self.tasks,
            "components": self.components(),
            "kernel": {"recipe": self.kernel, "version": self.versions.get(self.kernel)} if self.kernel else None,
        }

    def summary(self) -> list[str]:
        comps = self.components()
        present = [c for c, ok in comps.items() if ok]
        lines = [
            f"  graph: {self.image} needs {len(self.recipes)} recipes, {self.tasks} tasks",
            f"  alma components: {len(present)} of {len(comps)} in the graph"
            + (f" ({', '.join(present)})" if present else "")
            + (f"; MISSING: {', '.join(self.missing)}" if self.missing else ""),
        ]
        if self.kernel:
            lines.append(f"  kernel: {self.kernel} {self.versions.get(self.kernel, '(no version in the graph)')}")
        else:
            lines.append(f"  kernel: none in the graph (no recipe with {KERNEL_TASK})")
        return lines


def read_graph(topdir: Path, image: str) -> Graph | None:
    """The graph ``bitbake -g`` left in ``topdir``; None when it wrote none."""
    buildlist, dot = topdir / BUILDLIST, topdir / TASK_DOT
    if not buildlist.is_file() or not dot.is_file():
        return None
    recipes = [ln.strip() for ln in buildlist.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    tasks = 0
    versions: dict[str, str] = {}
    kernel = None
    with dot.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.startswith('"') or ' [label="' not in line:
                continue  # an edge, or the digraph's braces
            tasks += 1
            node = line[1 : line.index('"', 1)]
            pn, _, task = node.rpartition(".")
            label = line.split(' [label="', 1)[1]
            parts = label.split("\\n")
            if pn not in versions and len(parts) > 1 and parts[1].startswith(":"):
                versions[pn] = parts[1][1:]
            if task == KERNEL_TASK and kernel is None:
                kernel = pn
    return Graph(image, recipes, tasks, versions, kernel)
