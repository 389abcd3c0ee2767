"""Front matter is the other YAML path of the loader (aliases refused outright): tags, deep
nesting and a recursive anchor are each a clear exit 2 naming the document, and the good
document is still judged (hostile-YAML tests for every loader path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gates.test_gates import IMAGE, MACHINE, write_doc, write_manifest

GOOD = "Kernel <!-- fact:kernel_version -->5.15.185<!-- /fact -->.\n"
CASES = {
    "python tag": ("x: !!python/object/apply:os.system [true]\n", "YAML value refused"),
    "unknown tag": ("x: !custom 1\n", "YAML value refused"),
    "deep nesting": ("x: " + "[" * 500 + "]" * 500 + "\n", "nested more than 100 levels"),
    "recursive anchor": ("x: &r [*r]\n", "YAML alias *r refused"),
    "binary": ("x: !!binary AAAA\n", "front matter"),
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_front_matter_is_exit_2_naming_the_doc(project: Path, alma, case: str) -> None:
    body, needle = CASES[case]
    write_manifest(project)
    write_doc(project, GOOD, name="a-good.md", claims="image_buildable: true")
    bad = project / "docs" / "gates" / "b-bad.md"
    bad.write_text(f"---\ngate: g\nmachine: {MACHINE}\nimage: {IMAGE}\n{body}---\nText.\n")
    r = alma("gates", "check")
    assert r.code == 2, (r.out, r.err)
    assert "b-bad.md" in r.out and needle in r.out, r.out
    assert "internal error" not in r.err and "Traceback" not in r.out + r.err
