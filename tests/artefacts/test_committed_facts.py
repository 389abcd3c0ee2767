"""The committed facts manifests name the places `alma verify` really searches (the
committed file listed build/tmp/... paths verify had stopped using), and carry every fact
name the code knows (a fact added later must appear, null, in the committed file)."""

from __future__ import annotations

import json
import re

from support import REPO

from alma.artefacts.verify import ARTEFACT_FACTS
from alma.buildtree import build_tree


def test_committed_absent_manifests_list_the_search_paths_verify_uses() -> None:
    manifests = sorted((REPO / "facts").glob("*.json"))
    assert manifests
    for path in manifests:
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert set(ARTEFACT_FACTS) <= set(doc["facts"]), f"{path.name}: regenerate with alma verify --absent"
        for name, fact in doc["facts"].items():
            m = re.search(r"no deploy dir found \((.*)\); not built", fact["source"])
            if m is None:
                continue
            want = [str(d.relative_to(REPO)) for d in build_tree(REPO, env={}).deploy_dirs(doc["machine"])]
            assert m.group(1).split(", ") == want, f"{path.name}: {name} lists {m.group(1)}, verify searches {want}"
