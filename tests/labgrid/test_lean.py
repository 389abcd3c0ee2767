"""The host install stays lean: labgrid is the ``labgrid`` extra only, and no verb of ``alma``
imports it (only ``alma.labgrid`` does). With labgrid made unimportable, ``alma --help`` and
every verb's ``--help`` still work, and none of them loads it."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from support import REPO

from alma.cli import main as climain

BLOCK = """
import sys
class _NoLabgrid:
    def find_spec(self, name, path=None, target=None):
        if name == "labgrid" or name.startswith("labgrid."):
            raise ImportError("labgrid is not installed (blocked by the test)")
        return None
sys.meta_path.insert(0, _NoLabgrid())
from alma.cli.main import main
for argv in ARGVS:
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), (argv, exc.code)
assert not [m for m in sys.modules if m == "labgrid" or m.startswith("labgrid.")]
print("LEAN", len(ARGVS))
"""


def test_no_verb_needs_or_loads_labgrid() -> None:
    argvs = [["--help"]] + [[verb, "--help"] for verb in climain.VERBS]
    code = f"ARGVS = {argvs!r}\n{BLOCK}"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"LEAN {len(argvs)}" in r.stdout


def test_labgrid_is_an_extra_not_a_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.lower().startswith("labgrid") for d in project["dependencies"])
    assert project["optional-dependencies"]["labgrid"] == ["labgrid>=26,<27"]
    scripts = project["scripts"]
    assert scripts["alma-labgrid-exporter"] == "alma.labgrid.export:main"
