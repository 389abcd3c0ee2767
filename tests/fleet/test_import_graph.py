"""The fleet modules import each other without a circle: every import statement counts (a
function-level import is a circle that only waits for its first call), except imports for
type hints only (``if TYPE_CHECKING:``)."""

from __future__ import annotations

import ast
from pathlib import Path

import alma.fleet.severity

FLEET = Path(alma.fleet.severity.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks hold no runtime import
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "alma.fleet":
                out |= {f"alma.fleet.{a.name}" for a in node.names}
            elif node.module.startswith("alma.fleet."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("alma.fleet.")}
    return out


def test_no_import_circle_among_fleet_modules() -> None:
    graph = {f"alma.fleet.{p.stem}": _imports(p) for p in FLEET.glob("*.py") if p.stem != "__init__"}
    assert "alma.fleet.inventory" in graph["alma.fleet.health"]  # the graph was read

    def cycle_from(start: str) -> list[str] | None:
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            mod, path = stack.pop()
            for nxt in sorted(graph.get(mod, ())):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [c for m in sorted(graph) if (c := cycle_from(m))]
    assert circles == [], " ; ".join(" -> ".join(c) for c in circles)
