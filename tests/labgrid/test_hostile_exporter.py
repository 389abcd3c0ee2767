"""The client's side against a hostile (or broken) exporter: what it publishes through the
coordinator (labgrid copies a remote resource's attributes onto it *without* running their
validators) and what its flash service answers are data, never trusted structure. Every case
ends in an AlmaError that names the problem, with no terminal control characters from the
peer in its message or hint, and never in an unrelated exception (a traceback in CI)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labgrid import Target
from labgrid.binding import BindingState
from support_flash import Station, sha256

from alma.errors import AlmaError
from alma.flash.flasher import DEFAULT_TIMEOUTS
from alma.flash.records import FlashRecord
from alma.labgrid import AlmaFlashDriver, NetworkAlmaRecoveryBoard

ESC = "\x1b]0;pwned\x07\x1b[2J"


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    station = Station(tmp_path)
    b = station.bundle("h")
    station.manifest(b)
    monkeypatch.setenv("ALMA_ROOT", str(station.root))
    return b


def _driver(service_port: int | None, connect_timeout: float = 10, **published: Any) -> AlmaFlashDriver:
    t = Target("hostile")
    res = NetworkAlmaRecoveryBoard(t, name=None, host="127.0.0.1", busnum=1, devnum=2, path="1-3",
                                   vendor_id=0x955, model_id=0x7523, usb_path="1-3", port=service_port)  # fmt: skip
    for k, v in published.items():
        setattr(res, k, v)  # as RemotePlaceManager.poll() does: no validator runs
    drv = AlmaFlashDriver(t, name=None, connect_timeout=connect_timeout)
    drv.state = BindingState.active  # no coordinator here to activate through
    return drv


def _clean(exc: AlmaError) -> None:
    for text in (exc.message, exc.hint or ""):
        assert not any(ord(c) < 32 and c not in "\n\t" for c in text), repr(text)


class FakeService:
    """A flash service that answers the request with scripted bytes, then closes; with ``drip``
    it stays and sends ``drip`` every 0.2 s (b"": silent) until the client hangs up."""

    def __init__(self, reply: bytes, drip: bytes | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.reply = reply
        self.drip = drip
        self.done = threading.Event()
        self.requests: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(30)
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(30)
            buf = b""
            while b"\n" not in buf:
                buf += conn.recv(65536)
            self.requests.append(json.loads(buf.split(b"\n", 1)[0]))
            with contextlib.suppress(OSError):  # the driver hangs up once it has seen enough (endless line)
                conn.sendall(self.reply)
                while self.drip is not None and not self.done.wait(0.2):
                    conn.sendall(self.drip)

    def close(self) -> None:
        self.done.set()
        self.sock.close()
        self.thread.join(10)


@pytest.fixture
def fake() -> Iterator[list[FakeService]]:
    made: list[FakeService] = []
    yield made
    for f in made:
        f.close()


PUBLISHED = [
    {"usb_path": ESC},
    {"usb_path": "../../1-3"},
    {"usb_path": None},
    {"port": True},
    {"port": 70000},
    {"port": -1},
    {"port": "ssh"},
    {"port": 1.5},
    {"host": "127.0.0.1:99999"},
    {"host": f"127.0.0.1{ESC}"},
    {"host": ""},
]


@pytest.mark.parametrize("published", PUBLISHED, ids=[repr(p)[:30] for p in PUBLISHED])
def test_hostile_published_attributes_are_refused_before_any_connection(
    published: dict[str, Any], bundle: Path
) -> None:
    drv = _driver(5, **published)
    with pytest.raises(AlmaError) as ei:
        drv.flash(bundle)
    _clean(ei.value)
    assert "published no valid" in ei.value.message or "cannot reach" in ei.value.message, ei.value.message


def _record(**over: Any) -> dict[str, Any]:
    rec = FlashRecord(board={"usb_instance": "1-3"}, bundle_sha256="0" * 64, bundle_path="/b", machine="m",
                      started="s", finished="f", result="FAILED", reason="storage never came").to_dict()  # fmt: skip
    rec.update(over)
    return rec


def _lines(*msgs: Any) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in msgs)


REPLIES = {
    "escapes-in-the-record": _lines(
        {"upload": False},
        {"result": _record(result=f"FAILED{ESC}", reason=ESC, board={"usb_instance": ESC}), "record_path": ESC},
    ),  # fmt: skip
    "escapes-in-an-error": _lines({"upload": False}, {"error": ESC, "hint": ESC}),
    "escapes-in-the-first-answer": _lines({"error": ESC, "hint": ESC}),
    "board-not-a-dict": _lines({"upload": False}, {"result": _record(board="1-3")}),
    "result-not-a-string": _lines({"upload": False}, {"result": _record(result=["SUCCESS"])}),
    "boot-board-not-a-dict": _lines({"upload": False}, {"result": _record(boot={"seen": True, "board": "x"})}),
    "boot-unknown-field": _lines({"upload": False}, {"result": _record(boot={"seen": True, "rm": "-rf"})}),
    "not-a-record": _lines({"upload": False}, {"result": "SUCCESS"}),
    "wrong-schema": _lines({"upload": False}, {"result": _record(schema="evil/9")}),
    "hint-not-a-string": _lines({"upload": False}, {"error": "no", "hint": {"a": 1}}),
    "endless-line": b'{"upload": false}\n' + b"x" * (2 << 20),
    "nothing": b"",
}


@pytest.mark.parametrize("name", list(REPLIES))
def test_hostile_service_replies_end_in_a_clear_error(name: str, bundle: Path, fake: list[FakeService]) -> None:
    svc = FakeService(REPLIES[name])
    fake.append(svc)
    drv = _driver(svc.port)
    with pytest.raises(AlmaError) as ei:
        drv.flash(bundle)
    _clean(ei.value)
    assert svc.requests and svc.requests[0]["sha256"] == sha256(bundle)


def _success(bundle: Path, **over: Any) -> dict[str, Any]:
    fields = {"result": "SUCCESS", "reason": None, "bundle_sha256": sha256(bundle), "bundle_path": f"/x/{bundle.name}"}
    return {"result": _record(**{**fields, **over}), "record_path": "/r"}


def test_a_success_from_the_service_is_returned(bundle: Path, fake: list[FakeService]) -> None:
    svc = FakeService(_lines({"upload": False}, _success(bundle)))
    fake.append(svc)
    rec = _driver(svc.port).flash(bundle)
    assert rec.result == "SUCCESS" and rec.board == {"usb_instance": "1-3"}


OTHER_FLASH = {
    "another-sha256": {"bundle_sha256": "f" * 64},
    "another-board": {"board": {"usb_instance": "1-4"}},
    "another-bundle": {"bundle_path": "/srv/evil-alma-image-x.rootfs.tegraflash.tar.gz"},
}


@pytest.mark.parametrize("name", list(OTHER_FLASH))
def test_a_success_record_of_another_flash_is_an_error(name: str, bundle: Path, fake: list[FakeService]) -> None:
    svc = FakeService(_lines({"upload": False}, _success(bundle, **OTHER_FLASH[name])))
    fake.append(svc)
    with pytest.raises(AlmaError) as ei:
        _driver(svc.port).flash(bundle)
    assert "record of another flash" in ei.value.message, ei.value.message
    _clean(ei.value)


@pytest.mark.parametrize("drip", [b"", b'{"event": "line", "text": "still here"}\n'], ids=["silent", "dripping"])
def test_an_exporter_that_never_ends_the_flash_meets_one_overall_deadline(
    drip: bytes, bundle: Path, fake: list[FakeService]
) -> None:
    svc = FakeService(_lines({"upload": False}), drip=drip)
    fake.append(svc)
    drv = _driver(svc.port)
    drv.timeouts = dict.fromkeys(DEFAULT_TIMEOUTS, 0.2)
    drv.boot_timeout = 0.2
    drv.deadline_slack = 0.5
    with pytest.raises(AlmaError) as ei:
        drv.flash(bundle)
    assert "no flash record" in ei.value.message and "within 2 s" in ei.value.message, ei.value.message


def test_a_service_that_never_answers_is_a_clear_busy_error(bundle: Path) -> None:
    """Connected (queued by the kernel) but never served, as while the service runs another flash."""
    with socket.create_server(("127.0.0.1", 0)) as busy:  # listens, never accepts
        drv = _driver(busy.getsockname()[1], connect_timeout=1)
        with pytest.raises(AlmaError) as ei:
            drv.flash(bundle)
    assert "did not answer within 1 s" in ei.value.message and "nothing was flashed" in ei.value.message
