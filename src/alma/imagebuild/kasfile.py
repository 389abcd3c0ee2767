"""The kas loader ``alma build`` and ``alma lint`` share: every problem kas would meet, with file:line.

Each file is read through :mod:`alma.loader` (UTF-8, duplicate keys refused, YAML aliases
bounded so a "billion laughs" in ``local_conf_header`` never expands), validated against
kas's own schema (``kas.CONFIGSCHEMA``) and header-version check, and its includes are
followed with kas 5.5's rules (``kas.includehandler``: repo-relative, then file-relative,
never outside the repository), so that a missing include or an include cycle is reported
at the ``includes:`` entry that causes it instead of kas's "Configuration file not found"
without a line, or Python's RecursionError. A machine file must build the machine it is
named for: ``kas/machines/X.yml`` whose merged ``machine:`` is another builds into the
wrong directory.

Threat model (docs/build.md, "Threat model"): kas files come from the repository and from
pull requests; they are trusted to name what to build, never to exhaust the host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alma import loader

MACHINES_DIR = "kas/machines"
UNREADABLE = "unreadable"  # not a finding about the file's content: it could not be judged at all


@dataclass(frozen=True, order=True)
class KasProblem:
    path: Path
    line: int
    message: str
    check: str = "kas-schema"  # kas-schema | kas-yaml | kas-include | kas-machine | unreadable


@dataclass
class KasFile:
    path: Path
    data: Any = None
    node: yaml.Node | None = None
    problems: list[KasProblem] = field(default_factory=list)

    def line(self, keys: list[Any]) -> int:
        return node_line(self.node, keys)


def node_line(node: yaml.Node | None, keys: list[Any]) -> int:
    """1-based line of the YAML node at ``keys`` (a jsonschema error path); 0 if unknown."""
    if node is None:
        return 0
    line = node.start_mark.line + 1
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            for knode, vnode in node.value:
                if knode.value == str(key):
                    line = knode.start_mark.line + 1
                    node = vnode
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def read(path: Path) -> KasFile:
    """One kas file: loaded safely, then kas's schema and header version, every problem kept."""
    kf = KasFile(Path(path))
    try:
        text = loader.read_text(kf.path, what="kas file", max_bytes=loader.MAX_CONFIG_BYTES)
    except loader.LoadError as exc:
        kf.problems.append(KasProblem(kf.path, exc.line, exc.why, UNREADABLE))
        return kf
    try:
        kf.node = loader.compose_yaml(text, kf.path, hint="fix the kas file, then: alma lint")
        kf.data = loader.construct_yaml(kf.node, kf.path, hint="fix the kas file, then: alma lint")
    except loader.LoadError as exc:
        kf.problems.append(KasProblem(kf.path, exc.line, exc.why, "kas-yaml"))
        return kf
    kf.problems += _schema(kf)
    return kf


def _schema(kf: KasFile) -> list[KasProblem]:
    from jsonschema.validators import validator_for

    import kas

    schema = vars(kas)["CONFIGSCHEMA"]  # set at import time by kas.configschema
    validator = validator_for(schema)(schema)
    problems = []
    for err in sorted(validator.iter_errors(kf.data), key=lambda e: list(map(str, e.absolute_path))):
        err = _explain(err)
        keys = list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = err.schema.get("properties", {})
            extra = [k for k in err.instance if k not in known]
            keys += extra[:1]  # point at the unexpected key itself
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        problems.append(KasProblem(kf.path, kf.line(keys), f"kas schema: at {where}: {err.message}"))
    if problems:
        return problems
    return _header(kf)


def _header(kf: KasFile) -> list[KasProblem]:
    """kas's own header-version verdict (kas.includehandler.ConfigFile.load); the file is safe by now."""
    from kas.includehandler import ConfigFile, LoadConfigException

    kas_log = logging.getLogger()
    level = kas_log.level
    kas_log.setLevel(logging.CRITICAL)  # kas logs what we already report
    try:
        ConfigFile.load(str(kf.path))
    except LoadConfigException as exc:
        msg = str(exc).replace(f": {kf.path}", "")
        return [KasProblem(kf.path, kf.line(["header", "version"]), f"kas header: {msg}")]
    finally:
        kas_log.setLevel(level)
    return []


def _explain(err: Any) -> Any:
    """The most telling sub-error of an anyOf/oneOf failure (kas's repo entries are
    "an object or null", so the raw message is just "not valid under any of the given schemas")."""
    while err.context:
        subs = [
            c
            for c in err.context
            if c.validator != "const" and not (c.validator == "type" and c.validator_value == "null")
        ]
        if not subs:
            break
        err = max(subs, key=lambda c: len(c.absolute_path))
    return err


@dataclass
class Chain:
    """A colon-list of kas files as kas loads it: every file in merge order, every problem."""

    files: list[KasFile] = field(default_factory=list)  # includes first, as kas merges them
    problems: list[KasProblem] = field(default_factory=list)

    def merged(self, key: str) -> tuple[Any, KasFile | None]:
        """The value the merge gives top-level ``key`` (the last file to set it wins), and that file."""
        value, where = None, None
        for kf in self.files:
            if isinstance(kf.data, dict) and key in kf.data:
                value, where = kf.data[key], kf
        return value, where


def load_chain(root: Path, top_files: list[Path]) -> Chain:
    """Follow every include of ``top_files`` like kas, reporting instead of raising."""
    chain = Chain()
    cache: dict[Path, KasFile] = {}
    repo = Path(root).resolve()

    def visit(path: Path, stack: list[Path]) -> None:
        kf = cache.get(path)
        if kf is None:
            kf = cache[path] = read(path)
            chain.problems += kf.problems
        header = kf.data.get("header") if isinstance(kf.data, dict) else None
        includes = header.get("includes") if isinstance(header, dict) else None
        for idx, inc in enumerate(includes if isinstance(includes, list) else []):
            if not isinstance(inc, str):
                continue  # {repo:, file:} includes name other repositories: kas resolves them after checkout
            line = kf.line(["header", "includes", idx])
            target = _resolve(repo, path, inc)
            if target is None:
                chain.problems.append(
                    KasProblem(path, line, f"include {inc!r} resolves outside the repository {repo}", "kas-include")
                )
                continue
            if not target.is_file():
                chain.problems.append(
                    KasProblem(
                        path,
                        line,
                        f"include {inc!r} not found (kas looks in {repo / inc} and next to the file)",
                        "kas-include",
                    )
                )
                continue
            if target in stack:
                cycle = " -> ".join(_rel(p, repo) for p in [*stack[stack.index(target) :], target])
                chain.problems.append(KasProblem(path, line, f"include cycle: {cycle}", "kas-include"))
                continue
            visit(target, [*stack, target])
        chain.files.append(kf)
        # kas 5.5 merges <file>.lock<suffix> right after the file (IncludeHandler): read it
        # here first, so kas never parses one this loader has not judged (an alias bomb in a
        # lock file would otherwise expand inside kas's own PyYAML load)
        lock = path.with_name(path.stem + ".lock" + path.suffix)
        if not path.stem.endswith(".lock") and lock.is_file() and lock not in stack:
            visit(lock.resolve(), [*stack, lock.resolve()])

    for top in top_files:
        top = Path(top).resolve()
        if not top.is_file():
            chain.problems.append(KasProblem(top, 0, "kas file not found", "kas-include"))
            continue
        visit(top, [top])
    return chain


def _resolve(repo: Path, current: Path, include: str) -> Path | None:
    """kas 5.5 IncludeHandler: repo-relative first, then relative to the including file."""
    for base in (repo, current.parent):
        cand = (base / include).resolve()
        if not cand.is_relative_to(repo):
            return None
        if cand.exists():
            return cand
    return (repo / include).resolve()


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def machine_problems(root: Path, machine_file: Path, chain: Chain) -> list[KasProblem]:
    """``kas/machines/X.yml`` (with everything after it in the chain) must build MACHINE X."""
    mfile = Path(machine_file).resolve()
    want = mfile.stem
    value, where = chain.merged("machine")
    if value == want:
        return []
    order = [kf.path for kf in chain.files]
    if where is None or (mfile in order and order.index(where.path) < order.index(mfile)):
        inherited = f" and inherits {value!r} from {_rel(where.path, Path(root).resolve())}" if where else ""
        return [
            KasProblem(
                mfile,
                1,
                f"machine file {want}.yml sets no machine:{inherited}; add machine: {want}",
                "kas-machine",
            )
        ]
    line = where.line(["machine"])
    if where.path == mfile:
        msg = f"machine file {want}.yml sets machine: {value!r}; it would build {value} into build/{want}"
    else:
        msg = f"sets machine: {value!r}, overriding {want} of kas/machines/{want}.yml"
    return [KasProblem(where.path, line, msg, "kas-machine")]
