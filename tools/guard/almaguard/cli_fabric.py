"""``alma-fabric``: networkd files for this board's routed fabric links, and the bridge check.

Exit codes: 0 ok; 1 ``check`` found a config that bridges a fabric port; 2 usage or
configuration error (with a "try:" hint); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from almaboard import netcheck
from almaboard.errors import run_main
from almaboard.files import write_atomic
from almaboard.paths import from_root

from . import __version__
from .errors import GuardError
from .fabric import NETWORK_PREFIX, load, node_name

EPILOG = """commands:
  generate  write /run/systemd/network/10-alma-fabric-<port>.network for this node (boot service)
  show      the links, addresses and routes of a node
  check     find networkd/NetworkManager/ifupdown configs under ROOT that bridge a fabric port

exit codes: 0 ok; 1 check found a bridged fabric port; 2 usage or configuration error; 130 interrupted
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="alma-fabric",
        description="Routed point-to-point fabric links for systemd-networkd; never a bridge.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"alma-fabric {__version__}")
    p.add_argument("--root", metavar="DIR", help="prefix for machine paths (/etc, /run)")
    p.add_argument("--config", metavar="FILE", help="fabric description (default /etc/alma/fabric.toml under --root)")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--node", help="this board's node name (default: /etc/hostname)")
    g.add_argument("--out", metavar="DIR", help="output directory (default /run/systemd/network under --root)")
    s = sub.add_parser("show")
    s.add_argument("--node")
    s.add_argument("--json", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("rootfs", nargs="?", default=None, help="root filesystem to scan (default: --root or /)")
    c.add_argument("--port", action="append", default=[], help="extra fabric port name or glob (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_main("alma-fabric", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return _commands(args)
    except OSError as exc:
        raise GuardError(str(exc), hint="check the path and its permissions") from exc


def _commands(args: argparse.Namespace) -> int:
    paths = from_root(args.root)
    if args.cmd == "check":
        rootfs = Path(args.rootfs) if args.rootfs else paths.root
        hits = netcheck.scan_rootfs(rootfs, args.port)
        for h in hits:
            print(f"{h.path}:{h.line}: {h.message}")
        if not hits:
            print(f"no fabric port is bridged under {rootfs}")
        return 1 if hits else 0
    cfg = Path(args.config) if args.config else paths.etc_alma / "fabric.toml"
    fab = load(cfg)
    node = args.node or node_name(paths("/etc/hostname"))
    if node not in fab.nodes:
        print(f"alma-fabric: node {node} has no fabric link in {cfg}; nothing to do", file=sys.stderr)
    files = fab.networkd_files(node)
    if args.cmd == "show":
        data = {"node": node, "files": files, "routes": fab.routes(node), "ports": fab.ports(node)}
        print(json.dumps(data, indent=1) if args.json else "\n".join(f"== {k}\n{v}" for k, v in files.items()))
        return 0
    out = Path(args.out) if args.out else paths("/run/systemd/network")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_atomic(out / name, text.encode(), durable=False)
    for stale in out.glob(f"{NETWORK_PREFIX}*.network"):
        if stale.name not in files:
            stale.unlink()  # a link removed from the description must not linger
    print(f"alma-fabric: node {node}: wrote {len(files)} file(s) to {out}")
    return 0
