"""docs/cli.md's exit-code table (generated from each command's help) against the code that
exits. The reference once said the codes were "the same for every verb" while `alma flash`
exits 3/4/5, `alma boards --wait` 124 and `alma fleet inspect` 3.

The code side is read from the source (AST): every ``sys.exit(...)`` of a verb's CLI module
whose argument is an integer (literal or named constant), and every ``EXIT_*`` constant of the
alma modules that module imports (``alma.flash.session`` defines flash's). Every such code
must be in the command's documented list, and every documented code beyond the shared ones
(0, 1, 2, 70, 130, see alma.errors) must be one the code can produce.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from alma.cli import reference
from alma.cli.main import VERBS
from alma.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NEGATIVE, EXIT_OK, EXIT_USAGE

SHARED = {EXIT_OK, EXIT_NEGATIVE, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED}


def _source(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # "alma.cli.output.console": a name in a module, not a module
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _int_constants(tree: ast.Module) -> dict[str, int]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def _imported_alma_modules(tree: ast.Module) -> set[str]:
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("alma."):
            mods.add(node.module)
            for alias in node.names:  # from alma.flash import session
                if _source(f"{node.module}.{alias.name}") is not None:
                    mods.add(f"{node.module}.{alias.name}")
    return mods - {"alma.errors"}


def codes_in_code(module: str) -> set[int]:
    path = _source(module)
    assert path is not None, module
    tree = ast.parse(path.read_text(encoding="utf-8"))
    consts = _int_constants(tree)
    found: set[int] = set()
    for mod in _imported_alma_modules(tree):
        src = _source(mod)
        if src is None:
            continue
        for name, value in _int_constants(ast.parse(src.read_text(encoding="utf-8"))).items():
            if name.startswith("EXIT_") or name.endswith("_EXIT"):
                found.add(value)
                consts.setdefault(name, value)
    from alma import errors

    consts.update({k: v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)})
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "exit"
            and node.args
        ):
            arg = node.args[0]
            for sub in ast.walk(arg):  # sys.exit(3 if unreachable else 0) too
                if isinstance(sub, ast.Constant) and type(sub.value) is int:
                    found.add(sub.value)
                elif isinstance(sub, ast.Name) and sub.id in consts:
                    found.add(consts[sub.id])
    return found


COMMANDS = reference.commands()


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_documented_exit_codes_are_the_ones_the_code_uses(name: str) -> None:
    cmd = dict(COMMANDS)[name]
    verb = name.split()[1]
    documented = set(reference.exit_codes(cmd))
    assert documented, f"{name}: its help lists no exit codes"
    module = VERBS[verb][0]
    used = codes_in_code(cmd.callback.__module__ if cmd.callback else module)
    usage = getattr(cmd, "usage_exit_code", EXIT_USAGE)
    must = used | {EXIT_OK, EXIT_INTERNAL, usage}
    assert must <= documented, f"{name}: exits with {sorted(must - documented)} but its help does not say so"
    extra = documented - used - SHARED - {usage}
    assert not extra, f"{name}: documents {sorted(extra)}, which no code path of {module} produces"


def test_the_reference_lists_each_commands_codes_and_no_longer_claims_one_set_for_all() -> None:
    text = reference.render()
    assert "The same for every verb" not in text
    table = {row.split("|")[1].strip(" `"): row.split("|")[2].strip() for row in text.splitlines()
             if row.startswith("| `alma ")}  # fmt: skip
    assert set(table) == {n for n, _ in COMMANDS}
    codes = {name: set(cell.split(", ")) for name, cell in table.items()}
    # success and a bug (traceback) are every command's; the rest differs per command
    assert all({str(EXIT_OK), str(EXIT_INTERNAL)} <= listed for listed in codes.values()), codes
    assert "124" in codes["alma boards"]
    assert {"3", "4", "5"} <= codes["alma flash"]
    assert "3" in codes["alma fleet inspect"]
    committed = (Path(__file__).parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    assert reference.exit_code_table() in committed, "docs/cli.md is stale: regenerate it"
