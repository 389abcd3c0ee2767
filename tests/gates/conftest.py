"""Fixtures: a project checkout with realistic deploy dirs, and the CLI run in-process."""

from artefacts.alma_deployfix import alma, project  # noqa: F401 - fixtures
