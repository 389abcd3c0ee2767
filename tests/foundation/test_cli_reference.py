"""docs/cli.md is generated from the click app; CI fails when the committed copy drifts."""

from __future__ import annotations

from pathlib import Path

from support import REPO

from alma.cli import reference


def test_committed_cli_reference_matches_the_code() -> None:
    committed = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == reference.render(), (
        "docs/cli.md is stale: run `.venv/bin/python -m alma.cli.reference > docs/cli.md`"
    )


def test_the_repository_cites_its_own_docs_not_files_outside_it() -> None:
    """docs/architecture.md is the project's own page: nothing may point at a copy outside the repo."""
    outside = ("ARCHITECTURE.md", "FIELD-NOTES", "/work/shared")
    hits = []
    for base in ("src", "tools", "tests", "docs", "bench", ".ci", "README.md"):
        paths = [REPO / base] if (REPO / base).is_file() else sorted((REPO / base).rglob("*"))
        for path in paths:
            if not path.is_file() or path.suffix in (".pyc", ".png", ".gz") or path == Path(__file__):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            hits += [f"{path.relative_to(REPO)}: {word}" for word in outside if word in text]
    assert not hits, "\n".join(hits)
    assert (REPO / "docs" / "architecture.md").is_file()
