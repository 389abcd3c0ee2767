"""docs/cli.md is generated from the click app; CI fails when the committed copy drifts."""

from __future__ import annotations

from support import REPO

from alma.cli import reference


def test_committed_cli_reference_matches_the_code() -> None:
    committed = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == reference.render(), (
        "docs/cli.md is stale: run `.venv/bin/python -m alma.cli.reference > docs/cli.md`"
    )
