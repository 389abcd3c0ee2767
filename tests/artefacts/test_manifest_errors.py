"""A facts manifest that cannot be read is a ConfigError with a hint, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from alma.artefacts.manifest import load_manifest
from alma.errors import ConfigError


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"{not json", b"[]"])
def test_unreadable_manifest_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "alma-image-jetson-orin-nano-devkit.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as ei:
        load_manifest(path)
    assert str(path) in ei.value.message and ei.value.hint
