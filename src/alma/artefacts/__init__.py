"""Build artefacts on disk: find them by their real meta-tegra names, read facts from them,
and keep the facts manifest (``facts/<image>-<machine>.json``, docs/formats.md)."""
