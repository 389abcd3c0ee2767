"""kas files: kas's own schema and header-version check, and pinned commits.

kas's schema accepts ``commit: main`` and a repo with only a ``branch``; a reproducible
build needs a full 40-hex commit, either in the file or in the lock file kas applies next
to it (``<file>.lock.yml``, ``overrides.repos.<id>.commit``, as ``kas lock`` writes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alma.imagebuild.project import FULL_SHA, schema_problems, yaml_line
from alma.lint.findings import Finding


def kas_files(kas_dir: Path) -> list[Path]:
    return sorted(p for ext in ("*.yml", "*.yaml") for p in kas_dir.rglob(ext))


def lock_file_for(path: Path) -> Path:
    return path.with_name(path.stem + ".lock" + path.suffix)


def _load(path: Path) -> dict[str, Any] | None:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def check_schema(files: list[Path]) -> list[Finding]:
    return [Finding(p.path, p.line, p.message, "kas-schema") for f in files for p in schema_problems(f)]


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
