"""`alma verify --out` where nothing can be written: a clear exit 2 naming the place, never a
traceback (`verify --absent --out <unwritable>` exited 70). Root can write anywhere,
so "unwritable" is a path under a regular file and a path that is a directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from artefacts.alma_deployfix import build_deploy


@pytest.mark.parametrize("absent", [True, False], ids=["absent", "deploy-dir"])
@pytest.mark.parametrize("kind", ["under-a-file", "a-directory"])
def test_an_unwritable_out_is_exit_2_with_the_place(
    project: Path, alma, tmp_path: Path, absent: bool, kind: str
) -> None:
    blocker = tmp_path / "blocker"
    if kind == "under-a-file":
        blocker.write_text("not a directory\n")
        out = blocker / "facts.json"
    else:
        blocker.mkdir()
        (blocker / "keep").write_text("x")
        out = blocker
    args = ["verify", "--absent"] if absent else ["verify", build_deploy(project).dir]
    r = alma(*args, "--root", project, "--out", out)
    assert r.code == 2, (r.out, r.err)
    assert f"cannot write the manifest {out}" in r.err and "try: choose a writable place" in r.err
    assert "internal error" not in r.err and "Traceback" not in r.err
    assert not list(tmp_path.glob("**/*.tmp")) and not list(tmp_path.glob("**/.*.tmp*"))
