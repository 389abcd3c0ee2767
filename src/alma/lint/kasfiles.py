"""kas files: everything ``alma build`` would refuse (the same loader, alma.imagebuild.kasfile:
encoding, YAML safety, duplicate keys, kas's schema and header version, includes, the
machine a machine file builds), and pinned commits.

kas's schema accepts ``commit: main`` and a repo with only a ``branch``; a reproducible
build needs a full 40-hex commit, either in the file or in the lock file kas applies next
to it (``<file>.lock.yml``, ``overrides.repos.<id>.commit``, as ``kas lock`` writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alma.imagebuild import kasfile
from alma.imagebuild.project import FULL_SHA
from alma.lint.findings import Finding


def kas_files(kas_dir: Path) -> list[Path]:
    return sorted(p for ext in ("*.yml", "*.yaml") for p in kas_dir.rglob(ext))


def lock_file_for(path: Path) -> Path:
    return path.with_name(path.stem + ".lock" + path.suffix)


def _load(path: Path) -> dict[str, Any] | None:
    kf = kasfile.read(path)  # a schema problem is reported elsewhere; pins are still checked
    return kf.data if isinstance(kf.data, dict) else None


def yaml_line(path: Path, keys: list[Any]) -> int:
    return kasfile.read(path).line(keys)


def check_checkout(root: Path) -> list[Finding]:
    """kas needs the checkout to be a repository (alma build lists the same problem)."""
    from alma.imagebuild.project import Project

    problem = Project(root).vcs_problem()
    if problem is None:
        return []
    what, fix = problem
    return [Finding(root, 0, f"{what}; fix: {fix}", "kas-checkout")]


def check_files(root: Path, files: list[Path]) -> list[Finding]:
    """What build's loader says about every kas file: each file alone, each machine's chain
    (base, includes, machine file) and each feature on top of the default machine."""
    kas_dir = root / "kas"
    machines = sorted((kas_dir / "machines").glob("*.yml"))
    features = sorted((kas_dir / "features").glob("*.yml"))
    lock = [f for f in files if f.stem.endswith(".lock")]
    problems: set[kasfile.KasProblem] = set()
    for f in files:
        if f not in lock:
            problems |= set(kasfile.load_chain(root, [f]).problems)
    base = kas_dir / "alma.yml"
    for m in machines:
        chain = kasfile.load_chain(root, [base, m] if base.is_file() else [m])
        problems |= set(chain.problems)
        if not chain.problems:
            problems |= set(kasfile.machine_problems(root, m, chain))
        for feat in features:  # a feature that sets machine: would move every build
            fchain = kasfile.load_chain(root, [*([base] if base.is_file() else []), m, feat])
            if not fchain.problems:
                problems |= set(kasfile.machine_problems(root, m, fchain))
    return [Finding(p.path, p.line, p.message, p.check) for p in sorted(problems)]


def check_pins(files: list[Path]) -> list[Finding]:
    findings: list[Finding] = []
    for path in files:
        if path.stem.endswith(".lock"):
            findings += _check_lock(path)
            continue
        data = _load(path)
        if not data:
            continue
        lock = _load(lock_file_for(path)) if lock_file_for(path).exists() else None
        locked = ((lock or {}).get("overrides") or {}).get("repos") or {}
        for repo_id, spec in (data.get("repos") or {}).items():
            if not isinstance(spec, dict) or not spec.get("url"):
                continue  # the project's own repository, or a layer-only entry
            line = yaml_line(path, ["repos", repo_id])
            commit = spec.get("commit")
            if commit is not None:
                if not FULL_SHA.match(str(commit)):
                    findings.append(
                        Finding(
                            path,
                            yaml_line(path, ["repos", repo_id, "commit"]),
                            f"repo {repo_id}: commit {commit!r} is not a full 40-hex commit id "
                            "(kas accepts it, but it is not a pin)",
                            "kas-pin",
                        )
                    )
                continue
            pinned = (locked.get(repo_id) or {}).get("commit")
            if pinned is None:
                what = f"branch {spec['branch']!r}" if spec.get("branch") else "no commit"
                findings.append(
                    Finding(
                        path,
                        line,
                        f"repo {repo_id}: {what} and no entry in {lock_file_for(path).name}; "
                        "pin it with commit: <40-hex> or run: kas lock " + path.name,
                        "kas-pin",
                    )
                )
    return findings


def _check_lock(path: Path) -> list[Finding]:
    data = _load(path) or {}
    out = []
    for repo_id, spec in (((data.get("overrides") or {}).get("repos")) or {}).items():
        commit = (spec or {}).get("commit")
        if commit is None or not FULL_SHA.match(str(commit)):
            out.append(
                Finding(
                    path,
                    yaml_line(path, ["overrides", "repos", repo_id, "commit"]),
                    f"lock entry {repo_id}: commit {commit!r} is not a full 40-hex commit id",
                    "kas-pin",
                )
            )
    return out
