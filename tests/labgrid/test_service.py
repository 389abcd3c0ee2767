"""The exporter's flash service against its threat model (docs/labgrid.md#threat-model): one real
service process (python -m alma.labgrid) under umockdev-run, talked to over TCP like the
driver does. Bad requests end with an error and nothing written; an upload lands in a
private directory that is gone afterwards; the bundle's bytes decide, not the peer."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import require_tool
from support_flash import DEVICES, Station, sha256
from support_labgrid import DEADLINE_S, wait_for

from alma.labgrid import service

pytestmark = pytest.mark.slow


class Peer:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
        self.reader = service.LineReader(self.sock)

    def send(self, obj: Any) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict[str, Any] | None:
        return self.reader.read()

    def last(self) -> dict[str, Any]:
        """Read to the end of the conversation; the final message."""
        final: dict[str, Any] | None = None
        while (msg := self.read()) is not None:
            final = msg
        assert final is not None
        return final

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Station]]:
    station = Station(tmp_path_factory.mktemp("svc"))
    umockdev = require_tool("umockdev-run")
    proc = subprocess.Popen(
        [umockdev, "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--",
         sys.executable, "-m", "alma.labgrid", "--board", "1-3", "--listen", "127.0.0.1",
         "--bundle-dir", str(station.base / "deploy")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=station.env(), cwd=station.base,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening "), line
        yield int(line.split()[1]), station
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # EOF: the exporter is gone, the service stops
        try:
            assert proc.wait(DEADLINE_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _request(bundle: Path, **over: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "proto": service.PROTO, "op": "flash", "name": bundle.name, "size": bundle.stat().st_size,
        "sha256": sha256(bundle),
    }  # fmt: skip
    req.update(over)
    return req


def _in_place(port: int, station: Station, name: str, **kw: Any) -> tuple[Peer, Path]:
    """A client asking for a flash of a bundle the exporter uses in place (no upload)."""
    bundle = station.bundle(name, **kw)
    peer = Peer(port)
    peer.send(_request(bundle, path=str(bundle)))
    assert peer.read() == {"upload": False}
    return peer, bundle


def _uploads(station: Station) -> list[Path]:
    return list(station.work.glob("upload-*")) if station.work.exists() else []


def test_upload_lands_privately_and_is_gone_after_the_flash(svc: tuple[int, Station]) -> None:
    port, station = svc
    bundle = station.bundle("up")
    peer = Peer(port)
    peer.send(_request(bundle))  # no path: the exporter cannot share the file, it must be sent
    assert peer.read() == {"upload": True}
    peer.sock.sendall(bundle.read_bytes())
    final = peer.last()
    peer.close()
    assert final["exit_code"] == 0 and final["result"]["result"] == "SUCCESS", final
    assert final["result"]["bundle_sha256"] == sha256(bundle)
    assert Path(final["record_path"]).parent == station.records
    wait_for("the upload directory to be removed", lambda: not _uploads(station))


def test_bytes_that_do_not_hash_to_the_named_sha256_are_refused(svc: tuple[int, Station]) -> None:
    port, station = svc
    bundle = station.bundle("bad")
    peer = Peer(port)
    peer.send(_request(bundle, sha256="0" * 64))
    assert peer.read() == {"upload": True}
    peer.sock.sendall(bundle.read_bytes())
    final = peer.last()
    peer.close()
    assert final["result"]["result"] == "REFUSED", final
    assert "sha256" in final["result"]["reason"]
    assert final["exit_code"] == 2
    wait_for("the upload directory to be removed", lambda: not _uploads(station))


def test_a_shared_path_is_used_in_place(svc: tuple[int, Station]) -> None:
    port, station = svc
    bundle = station.bundle("shared")
    peer = Peer(port)
    peer.send(_request(bundle, path=str(bundle)))
    assert peer.read() == {"upload": False}
    final = peer.last()
    peer.close()
    assert final["result"]["result"] == "SUCCESS" and final["result"]["bundle_path"] == str(bundle)


def _outside(station: Station, bundle: Path) -> list[str]:
    """Paths a peer might name that are not bundles in the exporter's bundle_dirs."""
    elsewhere = station.base / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    copy = elsewhere / bundle.name
    copy.write_bytes(bundle.read_bytes())
    link = bundle.parent / ("link-" + bundle.name.split("-", 1)[1])  # a bundle name inside, pointing out
    link.unlink(missing_ok=True)
    link.symlink_to(copy)
    secret = bundle.parent / "not-a-bundle.key"  # inside, same size, not named like a bundle
    secret.write_bytes(b"k" * bundle.stat().st_size)
    return [str(copy), str(link), str(secret), f"{bundle.parent}/../../elsewhere/{bundle.name}"]


def test_a_path_outside_the_bundle_dirs_is_neither_used_nor_probed(svc: tuple[int, Station]) -> None:
    """Only bundles in the exporter's own bundle_dirs are used in place; any other path (a copy
    elsewhere, a symlink out, a file not named like a bundle, a ../ walk, a system file) gets the
    answer a missing file gets: send the bytes. Nothing is flashed from it, nothing recorded."""
    port, station = svc
    bundle = station.bundle("probe")
    before = len(station.records_list())
    passwd = Path("/etc/passwd")
    asks = [(p, bundle.stat().st_size) for p in _outside(station, bundle)] + [(str(passwd), passwd.stat().st_size)]
    for path, size in asks:
        peer = Peer(port)
        peer.send(_request(bundle, path=path, size=size))
        assert peer.read() == {"upload": True}, path
        peer.close()
        wait_for("the upload given up is torn down", lambda: not _uploads(station))  # one flash slot per board
    assert len(station.records_list()) == before
    wait_for("no upload directory left", lambda: not _uploads(station))


def test_a_client_vanishing_mid_upload_leaves_nothing_and_the_service_serves_on(svc: tuple[int, Station]) -> None:
    port, station = svc
    bundle = station.bundle("vanish")
    before = len(station.records_list())
    peer = Peer(port)
    peer.send(_request(bundle))
    assert peer.read() == {"upload": True}
    peer.sock.sendall(bundle.read_bytes()[:5000])
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # a reset, not a clean end: the client process died
    wait_for("the partial upload to be removed", lambda: not _uploads(station))
    assert len(station.records_list()) == before
    peer = Peer(port)  # the next client is served as usual
    peer.send(_request(bundle, path=str(bundle)))
    assert peer.read() == {"upload": False}
    final = peer.last()
    peer.close()
    assert final["result"]["result"] == "SUCCESS", final


def test_an_upload_cut_short_flashes_nothing(svc: tuple[int, Station]) -> None:
    port, station = svc
    bundle = station.bundle("short")
    before = len(station.records_list())
    peer = Peer(port)
    peer.send(_request(bundle))
    assert peer.read() == {"upload": True}
    peer.sock.sendall(bundle.read_bytes()[:1000])
    peer.sock.shutdown(socket.SHUT_WR)
    final = peer.last()
    peer.close()
    assert "short" in final["error"] and "nothing was flashed" in final["error"], final
    assert len(station.records_list()) == before
    wait_for("the upload directory to be removed", lambda: not _uploads(station))


BAD_REQUESTS = [
    {"name": "../../etc/passwd"},
    {"name": "x.rootfs.tegraflash.tar.gz/../../y"},
    {"name": "not-a-bundle.tar"},
    {"size": 0},
    {"size": -1},
    {"size": True},
    {"size": service.MAX_BUNDLE + 1},
    {"sha256": "A" * 64},
    {"sha256": "0" * 63},
    {"path": "relative/path"},
    {"options": {"pkc_key": "/root/.ssh/id_rsa"}},
    {"options": {"timeouts": {"flash": 0}}},
    {"options": {"timeouts": {"flash": float("inf")}}},
    {"options": {"timeouts": {"nope": 5}}},
    {"options": {"erase_nvme": "yes"}},
    {"board": "1-4"},
    {"proto": "alma-flash/0"},
    {"op": "erase"},
]


@pytest.fixture(scope="module")
def any_bundle(svc: tuple[int, Station]) -> Path:
    return svc[1].bundle("grammar")


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=[json.dumps(b)[:40] for b in BAD_REQUESTS])
def test_a_request_off_its_grammar_is_refused_with_nothing_written(
    bad: dict[str, Any], svc: tuple[int, Station], any_bundle: Path
) -> None:
    port, station = svc
    bundle = any_bundle
    before = len(station.records_list())
    peer = Peer(port)
    peer.sock.sendall(json.dumps(_request(bundle, **bad), allow_nan=True).encode() + b"\n")
    final = peer.last()
    peer.close()
    assert set(final) == {"error", "hint"}, final
    assert len(station.records_list()) == before and not _uploads(station)


def test_an_oversized_message_ends_the_connection(svc: tuple[int, Station]) -> None:
    port, _ = svc
    peer = Peer(port)
    peer.sock.sendall(b"{" + b" " * (service.MAX_MESSAGE + 10))
    final = peer.last()
    peer.close()
    assert "longer than" in final["error"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["proto", "op", "name", "size", "sha256", "path", "options", "x"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c,
                                                                                         max_size=3),
                                    max_leaves=8)))  # fmt: skip
def test_parse_request_accepts_only_its_grammar(msg: dict[str, Any]) -> None:
    """Generated requests: either a ProtocolError, or every field checked to its shape."""
    try:
        req = service.parse_request(msg)
    except service.ProtocolError:
        return
    assert "/" not in req["name"] and req["name"].endswith((".tar.gz", ".zip"))
    assert isinstance(req["size"], int) and 0 < req["size"] <= service.MAX_BUNDLE
    assert service.SHA256.fullmatch(req["sha256"])
    assert all(0 < v <= 86400 for v in req["timeouts"].values())


def test_a_client_that_leaves_mid_flash_is_named_in_the_record_not_ctrl_c(svc: tuple[int, Station]) -> None:
    port, station = svc
    bundle = station.bundle("leaves", outcomes={"*": "hang-storage"})
    before = len(station.records_list())
    peer = Peer(port)
    peer.send(_request(bundle, path=str(bundle)))
    assert peer.read() == {"upload": False}
    while (msg := peer.read()) is not None and msg.get("phase") != "storage":
        pass  # the flash waits for the board's storage now
    peer.close()
    wait_for("the interrupted flash's record", lambda: len(station.records_list()) > before)
    rec = station.records_list()[before]
    assert rec["result"] == "INTERRUPTED", rec
    assert "the client closed its connection" in str(rec["reason"]) and "Ctrl-C" not in str(rec["reason"]), rec


def test_a_client_that_half_closes_after_its_request_is_flashed_and_gets_its_record(svc: tuple[int, Station]) -> None:
    """shutdown(SHUT_WR) ends only the client's sending side: the service can still send, so
    the flash goes ahead and its record comes back (it used to read as "left"). It is asked
    once whether it still reads, not again by the flash's watcher."""
    port, station = svc
    bundle = station.bundle("half")
    peer = Peer(port)
    peer.send(_request(bundle, path=str(bundle)))
    peer.sock.shutdown(socket.SHUT_WR)  # with its request: the service sees it before the flash
    got = []
    while (msg := peer.read()) is not None:
        got.append(msg)
    peer.close()
    assert got[0] == {"upload": False}, got
    final = got[-1]
    assert final.get("exit_code") == 0 and final["result"]["result"] == "SUCCESS", final
    assert got.count({"event": "probe"}) == 1, got


def test_a_client_that_half_closes_mid_flash_is_not_taken_for_gone(svc: tuple[int, Station]) -> None:
    port, station = svc
    peer, _bundle = _in_place(port, station, "half-mid")
    while (msg := peer.read()) is not None and msg.get("event") != "line":
        pass  # the flash has begun
    peer.sock.shutdown(socket.SHUT_WR)
    final = peer.last()
    peer.close()
    assert final["result"]["result"] == "SUCCESS", final


def test_a_client_that_vanishes_mid_flash_is_named_so(svc: tuple[int, Station]) -> None:
    port, station = svc
    peer, bundle = _in_place(port, station, "vanish-mid", outcomes={"*": "hang-storage"})
    sha = sha256(bundle)
    while (msg := peer.read()) is not None and msg.get("phase") != "storage":
        pass
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # a reset: its process died

    def ours() -> list[dict[str, Any]]:  # records of other tests' flashes may land beside it
        return [r for r in station.records_list() if r.get("bundle_sha256") == sha]

    wait_for("the interrupted flash's record", lambda: bool(ours()))
    (rec,) = ours()
    assert rec["result"] == "INTERRUPTED" and "the client vanished" in str(rec["reason"]), rec
