"""``alma lint`` fabric check: no network config in the layer may bridge a fabric port.

The checker itself is the board library's ``almaboard.netcheck`` (stdlib only; the host
package ships almaboard), imported here, by the image class alma-fabric-check.bbclass
(through the layer's ``addpylib``) and by ``alma-fabric check`` on a board: one
implementation. Fabric ports: every ``[[link]]`` end of the fabric descriptions in the
layer and in tools/guard/conf (the one the image ships), plus ``ALMA_FABRIC_PORTS``
assignments in the layer's conf files.
"""

from __future__ import annotations

import re
from pathlib import Path

from almaboard import netcheck

from alma.lint.findings import Finding

CHECK = "fabric"
_SHIPPED_FABRIC = Path(__file__).resolve().parents[3] / "tools" / "guard" / "conf" / "fabric.toml"
_PORTS_VAR = re.compile(r'^\s*ALMA_FABRIC_PORTS\s*(?:\?\?=|\?=|\+=|=|:=|\.=|=\.)\s*"([^"]*)"', re.MULTILINE)


def _declared_ports(layer_dir: Path) -> list[str]:
    ports: list[str] = []
    for conf in sorted(layer_dir.glob("conf/**/*.conf")):
        try:
            text = conf.read_text(errors="replace")
        except OSError:
            continue
        for m in _PORTS_VAR.finditer(text):
            ports.extend(m.group(1).split())
    return ports


def check_layer(layer_dir: Path) -> list[Finding]:
    """Findings for every networkd/NetworkManager/ifupdown config under ``layer_dir`` that
    bridges a fabric port."""
    extra = _declared_ports(layer_dir)
    if _SHIPPED_FABRIC.is_file():
        extra.extend(sorted(netcheck.fabric_ports_from(_SHIPPED_FABRIC)))
    hits = netcheck.scan_tree(layer_dir, extra)
    return [Finding(Path(h.path), int(h.line), str(h.message), CHECK) for h in hits]
