"""``kas checkout`` and ``kas lock`` through alma: the same kas files, build tree and
environment as ``alma build``, the same reachability check (KAS_PREMIRRORS, GITCONFIG_FILE),
and a report of each repository read back from git and the lock files afterwards.

kas 5.5 (plugins/checkout.py, plugins/lock.py): ``kas checkout FILES`` clones and checks out
every repository without building; ``kas lock FILES`` writes ``<first file>.lock.yml`` (here
``kas/alma.lock.yml``, the first file of alma's chain is kas/alma.yml) with
``overrides.repos.<id>.commit`` for each repository that has no commit, and leaves locks that
are up to date alone; ``kas lock --update FILES`` ignores the lock files, follows each
repository's branch head and rewrites the locks that moved (in the lock file that holds them).
Both verbs take ``--update`` and ``--force-checkout`` as ``kas build`` does.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma import runner
from alma.buildtree import BuildTree, build_tree
from alma.errors import PreflightError, ToolError
from alma.imagebuild import preflight as pf
from alma.imagebuild.plan import machine_of
from alma.imagebuild.project import DEFAULT_MACHINE, KasConfig, Project, RepoPin, load_kas

TAIL_LINES = 15
# kas logs "2026-12-04 23:59:59 - INFO     - Cloning repository bitbake" on stderr
_KAS_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d - (INFO|WARNING|ERROR)\s+- (.*)$")


@dataclass
class RepoRun:
    """What ``alma checkout`` / ``alma lock`` will run: kas's verb on alma's chain, in alma's tree."""

    verb: str  # "checkout" | "lock"
    root: Path
    machine: str
    kas_files: list[Path]
    kas: KasConfig
    tree: BuildTree
    machine_dir: Path
    argv: list[str]
    env: dict[str, str]  # added to the caller's environment (the build tree, as alma build gives kas)
    update: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def lock_file(self) -> Path:
        """Where kas lock puts new locks: next to the first file of the chain (kas IncludeHandler
        ``get_lock_filename``)."""
        first = self.kas_files[0]
        return first.parent / f"{first.stem}.lock{first.suffix}"


def plan(
    verb: str,
    project: Project,
    *,
    machine: str | None = None,
    features: tuple[str, ...] = (),
    kas_files: tuple[str, ...] = (),
    build_dir: Path | None = None,
    update: bool = False,
    force_checkout: bool = False,
    env: Mapping[str, str] | None = None,
) -> RepoRun:
    """Offline: the chain checked like alma build checks it, the command and the environment."""
    env = os.environ if env is None else env
    project.require_layout()
    chosen = machine_of(machine or DEFAULT_MACHINE, machine is not None, env, project)
    files = project.kas_files(chosen, features) + project.extra_kas_files(kas_files)
    kas = load_kas(project, files)
    kas_env = {k: str(v) for k, v in (kas.data.get("env") or {}).items() if v is not None}
    tree = build_tree(project.root, build_dir, env, kas_env)
    machine_dir = tree.machine_dir(chosen)
    rel = ":".join(str(f.relative_to(project.root)) for f in files)
    opts = (["--update"] if update else []) + (["--force-checkout"] if force_checkout else [])
    argv = [pf._find_kas() or "kas", verb, *opts, rel]
    run = RepoRun(verb, project.root, chosen, files, kas, tree, machine_dir, argv,
                  {**tree.env(), "KAS_BUILD_DIR": str(machine_dir)}, update=update)  # fmt: skip
    for pin in kas.repos(tree.work_dir):
        state = pin.state()
        if state:
            run.notes.append(f"repository {pin.repo_id}: {state}")
    return run


def problems(run: RepoRun, probes: pf.Probes) -> list[pf.Problem]:
    """What stops kas before it starts: not a checkout, no kas, a repository kas's git cannot
    reach (asked as alma build's preflight asks). With --update every repository is fetched,
    checked out or not, so every one is asked."""
    project = Project(run.root)
    found = [p for p in (project.vcs_problem(),) if p is not None]
    if probes.find_kas() is None:
        found.append(("kas is not installed", ".venv/bin/pip install -e .  (kas is a dependency of alma)"))
    found += pf.unreachable_repos(probes, run.kas.repos(run.tree.work_dir), every=run.update)
    return found


def require(run: RepoRun, probes: pf.Probes) -> None:
    found = problems(run, probes)
    if found:
        err = PreflightError(found)
        n = len(found)
        err.message = f"kas {run.verb} not started: {n} problem{'s' if n != 1 else ''} to fix first:\n  " + "\n  ".join(
            f"{what}\n      fix: {fix}" for what, fix in found
        )
        raise err


def _lock_texts(run: RepoRun) -> dict[Path, bytes | None]:
    """Every lock file kas may write: those loaded with the chain, and the one for new locks."""
    paths = {p for p in run.kas.loaded if ".lock." in p.name} | {run.lock_file}
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(paths)}


def _pins(kas: KasConfig, work_dir: Path) -> dict[str, RepoPin]:
    return {p.repo_id: p for p in kas.repos(work_dir) if p.url}


def _head(path: Path) -> str | None:
    if not (path / ".git").exists():
        return None
    res = runner.capture(["git", "rev-parse", "HEAD"], cwd=path, check=False, stderr="separate")
    return res.lines[0].strip() if res.ok and res.lines else None


def execute(run: RepoRun, on_progress: Callable[[str], None], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run kas, pass its progress lines on, and read back what it did. Raises ToolError when kas fails."""
    before_locks = _lock_texts(run) if run.verb == "lock" else {}
    before = _pins(run.kas, run.tree.work_dir)
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def on_line(line: str) -> None:
        tail.append(line)
        m = _KAS_LOG.match(line)
        if m:
            on_progress(f"kas: {m.group(2)}" if m.group(1) == "INFO" else f"kas {m.group(1).lower()}: {m.group(2)}")

    full_env = {**(os.environ if env is None else env), **run.env}
    for d in (run.tree.work_dir, run.machine_dir.parent):  # kas creates KAS_BUILD_DIR itself, not its parents
        d.mkdir(parents=True, exist_ok=True)
    res = runner.run(run.argv, cwd=run.root, env=full_env, on_line=on_line, check=False, what="kas")
    if res.returncode != 0:
        errors = [m.group(2) for ln in tail if (m := _KAS_LOG.match(ln)) and m.group(1) == "ERROR"]
        raw = [ln for ln in tail if ln.strip() and not _KAS_LOG.match(ln)]  # not shown as progress (a traceback)
        nxt = (
            "alma build --dry-run lists each repository's URL and the premirror kas's git asks; fix the one named "
            "above (URL, branch, KAS_PREMIRRORS, GITCONFIG_FILE) and run the same command again"
        )
        raise ToolError(
            f"kas {run.verb} failed (kas exited with code {res.returncode})"
            + (": " + "; ".join(errors[-3:]) if errors else ""),
            returncode=res.returncode,
            hint=("kas's last words:\n    " + "\n    ".join(raw[-8:]) + "\n  then: " if raw and not errors else "")
            + nxt,
        )
    project = Project(run.root)
    after_kas = load_kas(project, run.kas_files) if run.verb == "lock" else run.kas
    after = _pins(after_kas, run.tree.work_dir)
    repos = []
    for rid, pin in after.items():
        old = before.get(rid)
        head = _head(pin.checkout_dir)
        entry: dict[str, Any] = {
            "repo": rid,
            "url": pin.url,
            "path": str(pin.checkout_dir),
            "head": head,
            "pinned": pin.commit,
        }
        if run.verb == "lock":
            entry["before"] = old.commit if old else None
            entry["changed"] = (old.commit if old else None) != pin.commit
        else:
            entry["state"] = pin.state() or ("at its pinned commit" if head and head == pin.commit else None)
        repos.append(entry)
    out: dict[str, Any] = {"verb": run.verb, "command": run.argv, "work_dir": str(run.tree.work_dir), "repos": repos}
    if run.verb == "lock":
        written = [str(p) for p, text in before_locks.items() if (p.read_bytes() if p.is_file() else None) != text]
        out["lock_files_written"] = written
        floating = [r["repo"] for r in repos if not r["pinned"]]
        if floating:  # kas leaves a repository locked only in another repository's lock file alone
            out["unpinned"] = floating
    return out


def summary_lines(out: dict[str, Any], root: Path) -> list[str]:
    def rel(p: str) -> str:
        try:
            return str(Path(p).relative_to(root))
        except ValueError:
            return p

    lines: list[str] = []
    if out["verb"] == "lock":
        changed = [r for r in out["repos"] if r["changed"]]
        written = out["lock_files_written"]
        lines.append(
            f"lock: {len(changed)} of {len(out['repos'])} repositories changed"
            + (f"; written: {', '.join(rel(p) for p in written)}" if written else "; no lock file changed")
        )
        for r in out["repos"]:
            was = (r["before"] or "(none)")[:12]
            now = (r["pinned"] or "(unpinned)")[:12]
            lines.append(f"  {r['repo']}: {was} -> {now}" if r["changed"] else f"  {r['repo']}: {now} (unchanged)")
        if written:
            lines.append("review the diff (git diff kas/), then alma build --check and commit the lock")
        for rid in out.get("unpinned", []):
            lines.append(f"  {rid}: still not pinned (locked in a lock file kas does not own?): alma build refuses it")
    else:
        lines.append(f"checked out {len(out['repos'])} repositories under {out['work_dir']}:")
        for r in out["repos"]:
            head = (r["head"] or "(not checked out)")[:12]
            lines.append(f"  {r['repo']}: {head}  {rel(r['path'])}" + (f"  ({r['state']})" if r["state"] else ""))
    return lines
