"""oelint-adv over a layer's recipes, classes and configs.

Run as CI runs it: ``--release scarthgap --mode all``; ``oelint.vars.homepageping`` is
suppressed because it fetches every HOMEPAGE over the network (CI has none). Every other
rule applies; a finding of any severity fails the lint.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from alma import runner
from alma.errors import ToolError, UserError
from alma.lint.findings import Finding

SUPPRESS = ("oelint.vars.homepageping",)  # network access; CI has none
PATTERNS = ("*.bb", "*.bbappend", "*.bbclass", "*.conf")
TIMEOUT_S = 600.0

# path:line:severity:id:message [branch:false]
_LINE = re.compile(
    r"^(?P<path>/[^:]+|[^:/][^:]*):(?P<line>\d+):(?P<sev>info|warning|error):(?P<id>[\w.\-]+):(?P<msg>.*)$"
)
_BRANCH = re.compile(r"\s*\[branch:[^\]]*\]$")


def layer_files(layer: Path) -> list[Path]:
    return sorted({p for pat in PATTERNS for p in layer.rglob(pat) if p.is_file()})


def find_oelint() -> str:
    from alma.settings import tool

    name = tool("oelint-adv")
    if os.sep not in name and not shutil.which(name):
        beside = Path(sys.executable).parent / name  # the venv alma runs from
        if os.access(beside, os.X_OK):
            return str(beside)
        raise UserError(
            "oelint-adv is not installed, so the layer cannot be linted",
            hint=".venv/bin/pip install -e .  (oelint-adv is a dependency of alma)",
        )
    return name


def parse_output(lines: list[str]) -> list[Finding]:
    findings = []
    for raw in lines:
        m = _LINE.match(raw.strip())
        if not m:
            continue
        msg = _BRANCH.sub("", m.group("msg"))
        findings.append(
            Finding(Path(m.group("path")), int(m.group("line")), f"{m.group('sev')}: {msg} ({m.group('id')})", "oelint")
        )
    return findings


def check_layer(layer: Path, release: str = "scarthgap") -> list[Finding]:
    files = layer_files(layer)
    if not files:
        return []
    argv = [find_oelint(), "--quiet", "--release", release, "--mode", "all"]
    for rule in SUPPRESS:
        argv += ["--suppress", rule]
    argv += [str(f) for f in files]
    res = runner.capture(argv, cwd=layer, timeout=TIMEOUT_S, check=False)
    findings = parse_output(res.lines)
    if res.returncode != 0 and not findings:
        tail = "\n".join(res.lines[-10:])
        raise ToolError(f"oelint-adv failed (exit {res.returncode}) without findings:\n{tail}", returncode=None)
    return findings
