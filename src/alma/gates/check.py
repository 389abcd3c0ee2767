"""``alma gates check`` / ``render``: judge every claim of every gate document.

Exit codes (documented in the CLI): 0 every claim holds; 1 stale (a claim is contradicted
by a fact, or asserts what the manifest cannot back); 2 cannot judge (missing manifest,
malformed document, unknown claim, no documents; with --strict also unmarked prose claims).
A missing input is never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.errors import ConfigError, UserError
from alma.gates import patterns as pt
from alma.gates.claims import HOLDS, STALE, UNBACKED, Size, fact_of, fact_value, judge, kind_of, parse_size, show
from alma.gates.doc import Claim, GateDoc, parse
from alma.gates.facts import FactsStore
from alma.gates.render import inline_text, yaml_text

ERROR, WARNING = "error", "warning"


@dataclass
class Finding:
    doc: str
    line: int
    verdict: str  # holds | stale | unbacked | error | warning
    claim: str | None = None
    written: str | None = None  # the claim as the doc states it
    fact: Any = None
    source: str | None = None
    message: str = ""
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    docs: int = 0

    def count(self, verdict: str) -> int:
        return sum(1 for f in self.findings if f.verdict == verdict)

    @property
    def exit_code(self) -> int:
        if self.count(ERROR):
            return 2
        if self.count(STALE) or self.count(UNBACKED):
            return 1
        return 0


def find_docs(paths: list[Path], root: Path) -> list[Path]:
    if not paths:
        d = root / "docs" / "gates"
        docs = sorted(d.glob("*.md"))
        if not docs:
            raise UserError(f"no gate documents in {d}", hint="alma gates check PATH..., or add docs/gates/<gate>.md")
        return docs
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob("*.md"))
            if not found:
                raise UserError(f"no gate documents (*.md) in {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise UserError(f"no such gate document: {p}", hint="check the path; gate docs live in docs/gates/")
    return out


def display(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


@dataclass
class Judged:
    claim: Claim
    verdict: str
    fact: Any
    source: str
    wanted_text: str | None = None  # inline with a filter: the rendered text


def judge_doc(doc: GateDoc, store: FactsStore) -> list[Judged]:
    m = store.for_doc(doc)
    facts = {k: f.value for k, f in m.facts.items()}
    out = []
    rendered: dict[tuple[str, str], str] = {}  # a filter's text depends only on the fact: render it once
    for c in doc.claims:
        fname = fact_of(c.name)
        if not m.has(fname):
            src = m.path or store.path_for(doc)
            raise ConfigError(
                f"{display(doc.path)}:{c.line}: claim {c.name!r}: {src} has no fact {fname!r}",
                hint="regenerate the manifest with alma verify (it writes every fact, null when unknown)",
            )
        fact = fact_value(c.name, m.fact(fname).value)
        source = m.fact(fname).source
        if c.where == "inline" and c.filter:
            key = (c.name, c.filter)
            if key not in rendered:
                rendered[key] = inline_text(c.name, fact, c.expected, c.filter, facts)
            want = rendered[key]
            if kind_of(c.name) == "size" and isinstance(c.expected, Size) and parse_size(want):
                verdict = judge(c.name, c.expected, fact)
            elif fact is None:
                verdict = HOLDS if c.expected is None else UNBACKED
            else:
                verdict = HOLDS if str(c.raw).strip() == want.strip() else STALE
            out.append(Judged(c, verdict, fact, source, want))
        else:
            out.append(Judged(c, judge(c.name, c.expected, fact), fact, source))
    return out


def _patterns_for(doc: Path, cache: dict[Path, list[pt.Pattern]]) -> list[pt.Pattern]:
    d = doc.parent
    if d not in cache:
        cache[d] = pt.load(d / "patterns.toml")
    return cache[d]


def check(paths: list[Path], *, root: Path, facts_dir: Path | None = None, strict: bool = False) -> Report:
    store = FactsStore(root, facts_dir or root / "facts")
    report = Report()
    pcache: dict[Path, list[pt.Pattern]] = {}
    for path in find_docs(paths, root):
        report.docs += 1
        name = display(path)
        fix = f"alma gates render --write {name}"
        try:
            doc = parse(path)
            judged = judge_doc(doc, store)
            pats = _patterns_for(path, pcache)
        except UserError as exc:
            line = 0
            msg = exc.message
            report.findings.append(Finding(name, line, ERROR, message=msg, fix=exc.hint))
            continue
        for j in judged:
            c = j.claim
            written = c.raw if isinstance(c.raw, str) else show(c.raw)
            f = Finding(name, c.line, j.verdict, c.name, written, j.fact, j.source)
            if j.verdict != HOLDS and c.where == "policy":
                f.message = (
                    f"{c.name}: the policy says {written!r}, the facts say {show(j.fact, c.name)}"
                    if j.verdict == STALE
                    else f"{c.name}: the policy says {written!r}, but the manifest cannot back it (fact unknown)"
                )
                f.fix = (
                    "fix the build (patch, update or waive with a reviewed reason, then alma build and alma verify), "
                    f"or raise the limit by hand in {name} (a reviewed change); render never rewrites a policy"
                )
            elif j.verdict == STALE:
                f.message = f"{c.name}: the doc says {written!r}, the facts say {show(j.fact, c.name)}"
                f.fix = fix
            elif j.verdict == UNBACKED:
                f.message = f"{c.name}: the doc says {written!r}, but the manifest cannot back it (fact unknown)"
                f.fix = f"{fix}  (states 'unknown'), or verify the artefacts: alma verify DEPLOY_DIR"
            report.findings.append(f)
        for hit in pt.scan(doc.prose, pats):
            report.findings.append(
                Finding(
                    name,
                    hit.line,
                    ERROR if strict else WARNING,
                    hit.pattern.claim,
                    hit.text,
                    message=f"unmarked claim {hit.text!r} (pattern {hit.pattern.name}"
                    + (f": {hit.pattern.message}" if hit.pattern.message else "")
                    + ")",
                    fix=f"mark it: <!-- fact:{hit.pattern.claim} -->{hit.text}<!-- /fact -->, claim it in the "
                    f"front matter, or end the line with {pt.IGNORE_MARK}",
                )
            )
    return report


def rerender(doc: GateDoc, judged: list[Judged], facts: dict[str, Any]) -> str:
    """The document with every value that does not hold re-rendered from the facts."""
    lines = list(doc.lines)
    edits: dict[int, list[tuple[int, int, str]]] = {}
    for j in judged:
        if j.verdict == HOLDS or j.claim.where == "policy":  # a reviewer's limit is never talked down
            continue
        c = j.claim
        if c.span is None:
            raise ConfigError(
                f"{display(doc.path)}:{c.line}: {c.name}: a multi-line value cannot be rewritten in place",
                hint="write the claim on one line (claim: value), then render again",
            )
        if c.where == "inline":
            text = j.wanted_text if j.wanted_text is not None else inline_text(c.name, j.fact, c.expected, None, facts)
        else:
            text = yaml_text(c.name, j.fact, c.expected)
        edits.setdefault(c.line - 1, []).append((c.span[0], c.span[1], text))
    for idx, spans in edits.items():
        line = lines[idx]
        for start, end, text in sorted(spans, reverse=True):
            line = line[:start] + text + line[end:]
        lines[idx] = line
    return "".join(lines)


def render(paths: list[Path], *, root: Path, facts_dir: Path | None = None) -> list[tuple[Path, str, str]]:
    """(path, old text, new text) for every document; errors raise (nothing is written)."""
    store = FactsStore(root, facts_dir or root / "facts")
    out = []
    for path in find_docs(paths, root):
        doc = parse(path)
        judged = judge_doc(doc, store)
        facts = {k: f.value for k, f in store.for_doc(doc).facts.items()}
        out.append((path, doc.text, rerender(doc, judged, facts)))
    return out
