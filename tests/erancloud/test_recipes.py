"""The board side, statically (the real bitbake parse is in docs/erancloud.md's record, done as
docs/layer.md, "Checked with real bitbake", says): eran-cloud and python3-nats-py are in alma-image only when the
kas feature sets ALMA_ERANCLOUD = "1"; both recipes build the PEP 517 way; the worker's own
imports need nothing but the stdlib, numpy and nats (no scikit-learn on the board)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

import yaml
from support import REPO

LAYER = REPO / "layers" / "meta-alma"
TOOL = REPO / "tools" / "erancloud"


def _var(text: str, name: str) -> str:
    m = re.search(rf'^{re.escape(name)}\s*[?:]*=\s*"([^"]*)"', text, re.M)  # values hold no quotes
    assert m, name
    return m.group(1).replace("\\\n", " ")


def test_the_feature_turns_on_exactly_eran_cloud() -> None:
    feature = yaml.safe_load((REPO / "kas" / "features" / "erancloud.yml").read_text())
    [block] = feature["local_conf_header"].values()
    assert block.strip() == 'ALMA_ERANCLOUD = "1"'
    assert 'ALMA_ERANCLOUD ??= "0"' in (LAYER / "conf" / "distro" / "alma.conf").read_text()
    image = (LAYER / "recipes-core" / "images" / "alma-image.bb").read_text()
    assert "oe.utils.conditional('ALMA_ERANCLOUD', '1', 'eran-cloud', '', d)" in image
    assert "eran-cloud" not in (LAYER / "recipes-core" / "packagegroups" / "packagegroup-alma.bb").read_text()


def test_recipes_build_pep517_from_the_right_sources() -> None:
    [cloud] = (LAYER / "recipes-alma" / "eran-cloud").glob("eran-cloud_*.bb")
    text = cloud.read_text()
    assert re.search(r"^inherit python_setuptools_build_meta$", text, re.M)
    assert _var(text, "SRC_URI") == "file://erancloud" and "${ALMA_TOOLS_DIR}" in text
    rdeps = _var(text, "RDEPENDS:${PN}").split()
    assert {"python3-nats-py", "python3-numpy"} <= set(rdeps)
    assert not any("sklearn" in d or "scikit" in d for d in rdeps)
    version = tomllib.loads((TOOL / "pyproject.toml").read_text())["project"]["version"]
    assert cloud.name == f"eran-cloud_{version}.bb"
    [nats] = (LAYER / "recipes-python" / "python3-nats-py").glob("python3-nats-py_*.bb")
    ntext = nats.read_text()
    assert re.search(r"^inherit pypi python_setuptools_build_meta$", ntext, re.M)
    assert re.fullmatch(r"[0-9a-f]{64}", _var(ntext, "SRC_URI[sha256sum]"))


def test_console_script_and_worker_imports() -> None:
    meta = tomllib.loads((TOOL / "pyproject.toml").read_text())
    assert meta["project"]["scripts"] == {"eran-cloud": "erancloud.cli:main"}
    allowed = set(sys.stdlib_module_names) | {"numpy", "nats", "erancloud"}
    for path in (TOOL / "erancloud").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "sklearn":
                    assert path.name == "data.py", f"{path.name} imports scikit-learn"  # the coordinator's loader
                    continue
                if top == "bcrypt":
                    assert path.name == "auth.py", f"{path.name} imports bcrypt"  # the operator's side
                    continue
                assert top in allowed, f"{path.name} imports {name}"
