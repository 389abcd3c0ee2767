"""``alma lint`` fabric check: no network config in the layer may bridge a fabric port.

The checker itself is tools/guard/almaguard/netcheck.py (stdlib only), loaded by path so
the image class alma-fabric-check.bbclass, ``alma-fabric check`` on a board and this lint
share one implementation. Fabric ports: every ``[[link]]`` end of the fabric descriptions
in the layer and in tools/guard/conf (the one the image ships), plus ``ALMA_FABRIC_PORTS``
assignments in the layer's conf files.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from alma.errors import ConfigError
from alma.lint.findings import Finding

CHECK = "fabric"
_NETCHECK = Path(__file__).resolve().parents[3] / "tools" / "guard" / "almaguard" / "netcheck.py"
_PORTS_VAR = re.compile(r'^\s*ALMA_FABRIC_PORTS\s*(?:\?\?=|\?=|\+=|=|:=|\.=|=\.)\s*"([^"]*)"', re.MULTILINE)


@cache
def _netcheck(path: Path = _NETCHECK) -> ModuleType:
    spec = importlib.util.spec_from_file_location("alma_netcheck", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ConfigError(f"fabric checker not found at {path}", hint="run alma from a full checkout of the repository")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("alma_netcheck", mod)  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


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
    nc = _netcheck()
    extra = _declared_ports(layer_dir)
    shipped = _NETCHECK.parents[1] / "conf" / "fabric.toml"
    if shipped.is_file():
        extra.extend(sorted(nc.fabric_ports_from(shipped)))
    hits = nc.scan_tree(layer_dir, extra)
    return [Finding(Path(h.path), int(h.line), str(h.message), CHECK) for h in hits]
