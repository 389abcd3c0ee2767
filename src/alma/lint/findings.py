"""One finding of any checker behind ``alma lint`` (kas schema, pins, oelint-adv, fabric).

Every checker returns ``list[Finding]``; the CLI prints ``path:line: message`` and the
``check`` name tells the user (and ``--json`` consumers) which checker spoke.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Finding:
    path: Path
    line: int  # 1-based; 0 when the finding is about the whole file
    message: str
    check: str  # e.g. "kas-schema", "kas-pin", "oelint", "fabric"

    def format(self, root: Path | None = None) -> str:
        """``path:line: message [check]``, with the path relative to ``root`` when under it."""
        shown = self.path
        if root is not None:
            try:
                shown = self.path.resolve().relative_to(root.resolve())
            except ValueError:
                shown = self.path
        return f"{shown}:{self.line}: {self.message} [{self.check}]"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["path"] = str(self.path)
        return data
